"""`make install` and `make uninstall` into a temporary DESTDIR, and systemd-sysusers and
systemd-tmpfiles applied to the staged tree.

Run: python3 -m pytest tests/test_install.py
"""

from __future__ import annotations

import pwd
import shutil
import stat
from pathlib import Path

import pytest

from systemd_support import REPO, ctl_binary, read_unit, run, stage_install

MAN_PAGES = ["man1/kioskauthctl.1", "man5/kioskauthd.conf.5", "man8/kioskauthd.8",
             "man8/pam_kioskauth.8"]


def files_under(root: Path) -> dict[str, int]:
    """Every non-directory under root, with its permission bits."""
    return {
        "/" + str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode)
        for p in root.rglob("*")
        if not p.is_dir()
    }


def expected_files(install) -> dict[str, int]:
    unit_dir = install.make_variable("SYSTEMDSYSTEMUNITDIR")
    files = {
        "/usr/sbin/kioskauthd": 0o755,
        "/usr/bin/kioskauthctl": 0o755,
        "/usr/libexec/kioskauth/kioskauth-store-key": 0o755,
        "/usr/libexec/kioskauth/kioskauth-fleet": 0o755,
        f"{unit_dir}/kioskauthd.socket": 0o644,
        f"{unit_dir}/kioskauthd.service": 0o644,
        f"{unit_dir}/kioskauthd-store-key.service": 0o644,
        install.make_variable("SYSUSERSDIR") + "/kioskauth.conf": 0o644,
        install.make_variable("TMPFILESDIR") + "/kioskauth.conf": 0o644,
        install.make_variable("CATALOGDIR") + "/kioskauth.catalog": 0o644,
        install.make_variable("UDEVDIR") + "/rules.d/70-kioskauth.rules": 0o644,
        "/usr/share/doc/kioskauth/examples/idp-network.conf": 0o644,
        "/usr/share/doc/kioskauth/examples/audit-delivery.conf": 0o644,
    }
    files.update({f"/usr/share/man/{page}": 0o644 for page in MAN_PAGES})
    if (REPO / "config/kioskauthd.conf").exists():
        files["/etc/kioskauth/kioskauthd.conf"] = 0o644
        files["/usr/share/doc/kioskauth/examples/kioskauthd.conf"] = 0o644
    if (REPO / "pam/pam_kioskauth.so").exists():
        files[install.make_variable("PAMMODULEDIR") + "/pam_kioskauth.so"] = 0o644
    if (REPO / "pam/pam-configs/kioskauth").exists():
        files["/usr/share/pam-configs/kioskauth"] = 0o644
    if (REPO / "pam/pam.d/kioskauth").exists():
        files["/etc/pam.d/kioskauth"] = 0o644
        files["/usr/share/doc/kioskauth/examples/kioskauth"] = 0o644
    if install.has_real_binaries:
        files["/usr/share/bash-completion/completions/kioskauthctl"] = 0o644
        files["/usr/share/zsh/vendor-completions/_kioskauthctl"] = 0o644
        files["/usr/share/fish/vendor_completions.d/kioskauthctl.fish"] = 0o644
    return files


@pytest.fixture
def staged(tmp_path):
    return stage_install(tmp_path)


def test_install_putsExactlyTheExpectedFiles(staged):
    assert files_under(staged.root) == expected_files(staged)
    assert (staged.root / "etc/kioskauth/kioskauthd.conf.d").is_dir()


def test_install_unitsNameTheInstalledPrograms(staged):
    for unit, program in [
        ("kioskauthd.service", "/usr/sbin/kioskauthd"),
        ("kioskauthd-store-key.service", "/usr/libexec/kioskauth/kioskauth-store-key"),
    ]:
        exec_start = read_unit(staged.unit_dir / unit)["Service"]["ExecStart"][0]
        assert exec_start.split()[0] == program
        assert staged.path(program).stat().st_mode & 0o111


def test_install_underPrefixUsrLocal_followsThePrefix(tmp_path):
    install = stage_install(tmp_path, prefix="/usr/local")
    service = read_unit(install.root / "usr/local/lib/systemd/system/kioskauthd.service")
    assert service["Service"]["ExecStart"] == ["/usr/local/sbin/kioskauthd"]
    assert (install.root / "usr/local/sbin/kioskauthd").is_file()
    # Where kioskauthd looks for its fleet helper: ../libexec/kioskauth from its own directory.
    assert (install.root / "usr/local/sbin/../libexec/kioskauth/kioskauth-fleet").is_file()
    assert (install.root / "usr/local/lib/sysusers.d/kioskauth.conf").is_file()
    assert (install.root / "usr/local/lib/systemd/catalog/kioskauth.catalog").is_file()
    assert (install.root / "usr/local/lib/udev/rules.d/70-kioskauth.rules").is_file()
    assert (install.root / "usr/local/share/man/man8/kioskauthd.8").is_file()
    # The daemon's configuration stays in /etc whatever the prefix.
    assert (install.root / "etc/kioskauth/kioskauthd.conf.d").is_dir()


def test_install_placesPamModuleWhereLibpamLoadsIt(tmp_path):
    module = tmp_path / "pam_kioskauth.so"
    module.write_bytes(b"\x7fELF stand-in: only the copy is under test")
    profile = tmp_path / "profile"
    profile.write_text("Name: kioskauth\n")
    install = stage_install(tmp_path, extra=[f"PAM_MODULE={module}", f"PAM_PROFILE={profile}"])
    libdir = run(["pkg-config", "--variable=libdir", "pam"]).stdout.strip()
    assert install.path(f"{libdir}/security/pam_kioskauth.so").read_bytes() == module.read_bytes()
    assert install.path("/usr/share/pam-configs/kioskauth").read_text() == "Name: kioskauth\n"


def test_install_neverOverwritesConfiguration(tmp_path):
    shipped = tmp_path / "kioskauthd.conf"
    shipped.write_text("# shipped default\n")
    edited = tmp_path / "root/etc/kioskauth/kioskauthd.conf"
    edited.parent.mkdir(parents=True)
    edited.write_text("# the administrator's\n")
    install = stage_install(tmp_path, extra=[f"DEFAULT_CONFIG={shipped}"])
    assert edited.read_text() == "# the administrator's\n"
    assert "keeping existing" in install.log
    assert install.path("/usr/share/doc/kioskauth/examples/kioskauthd.conf").read_text() == (
        "# shipped default\n"
    )


@pytest.mark.skipif(ctl_binary() is None, reason="kioskauthctl is not built")
def test_install_completionsGeneratedByKioskauthctl(staged):
    for path, marker in [
        ("/usr/share/bash-completion/completions/kioskauthctl", "complete"),
        ("/usr/share/zsh/vendor-completions/_kioskauthctl", "#compdef"),
        ("/usr/share/fish/vendor_completions.d/kioskauthctl.fish", "complete -c 'kioskauthctl'"),
    ]:
        text = staged.path(path).read_text()
        assert marker in text and "kioskauthctl" in text


def test_install_withoutBuiltBinaries_failsAndSaysWhy(tmp_path):
    result = run(
        ["make", "-C", REPO, "install", f"DESTDIR={tmp_path / 'root'}", "PREFIX=/usr",
         f"BIN_DIR={tmp_path / 'nothing'}", f"BUILD={tmp_path / 'build'}", "COMPLETIONS=no"],
        timeout=300,
    )
    assert result.returncode != 0
    assert "is missing: run 'make'" in result.stderr
    assert not (tmp_path / "root/usr/sbin/kioskauthd").exists()


def test_uninstall_removesEverythingButEditedConfiguration(tmp_path):
    shipped = tmp_path / "kioskauthd.conf"
    shipped.write_text("# shipped default\n")
    variables = [f"DEFAULT_CONFIG={shipped}"]
    install = stage_install(tmp_path, extra=variables)
    (install.root / "etc/kioskauth/kioskauthd.conf").write_text("# edited\n")
    result = run(
        ["make", "-C", REPO, "uninstall", f"DESTDIR={install.root}", "PREFIX=/usr",
         f"BUILD={install.build}", *variables],
    )
    assert result.returncode == 0, result.stderr
    assert files_under(install.root) == {"/etc/kioskauth/kioskauthd.conf": 0o644}


def test_uninstall_removesUneditedConfiguration(tmp_path):
    shipped = tmp_path / "kioskauthd.conf"
    shipped.write_text("# shipped default\n")
    variables = [f"DEFAULT_CONFIG={shipped}"]
    install = stage_install(tmp_path, extra=variables)
    result = run(
        ["make", "-C", REPO, "uninstall", f"DESTDIR={install.root}", "PREFIX=/usr",
         f"BUILD={install.build}", *variables],
    )
    assert result.returncode == 0, result.stderr
    assert files_under(install.root) == {}
    assert not (install.root / "etc/kioskauth").exists()


# --- sysusers.d and tmpfiles.d applied to the staged tree ----------------------------------------


def passwd_entries(root: Path, name: str) -> dict[str, list[str]]:
    return {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc" / name).read_text().splitlines()
        if line
    }


def test_sysusers_createsTheDaemonUserAndCallerGroups(staged):
    result = run(["systemd-sysusers", f"--root={staged.root}"])
    assert result.returncode == 0, result.stderr
    users = passwd_entries(staged.root, "passwd")
    groups = passwd_entries(staged.root, "group")
    assert set(groups) >= {"kioskauthd", "kioskauth", "kioskauth-admin"}
    user = users["kioskauthd"]
    uid, gid = int(user[2]), int(user[3])
    assert 0 < uid < 1000, "a system user"
    assert gid == int(groups["kioskauthd"][2])
    assert user[6].endswith("nologin")
    # The daemon's user belongs to neither caller group: being the daemon grants nothing there.
    for group in ("kioskauth", "kioskauth-admin"):
        assert "kioskauthd" not in groups[group][3].split(",")


def test_tmpfiles_createsDirectoriesWithTheUnitsModes(staged):
    assert run(["systemd-sysusers", f"--root={staged.root}"]).returncode == 0
    result = run(["systemd-tmpfiles", f"--root={staged.root}", "--create"])
    assert result.returncode == 0, result.stderr
    uid = int(passwd_entries(staged.root, "passwd")["kioskauthd"][2])
    for path, mode in [("var/lib/kioskauth", 0o700), ("run/kioskauth", 0o755)]:
        info = (staged.root / path).stat()
        assert stat.S_ISDIR(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == mode, path
        assert info.st_uid == uid, path
    # The same modes the service unit asks systemd for.
    service = read_unit(staged.unit_dir / "kioskauthd.service")["Service"]
    assert service["StateDirectoryMode"] == ["0700"]
    assert service["RuntimeDirectoryMode"] == ["0755"]


def test_tmpfiles_withoutTheUser_fails(staged):
    # Ordering matters on a real system too: tmpfiles cannot chown to a user sysusers has not
    # created yet, and says so.
    result = run(["systemd-tmpfiles", f"--root={staged.root}", "--create"])
    if "kioskauthd" in {p.pw_name for p in pwd.getpwall()}:
        pytest.skip("this machine has a kioskauthd user, which --root may fall back to")
    assert result.returncode != 0
    assert "kioskauthd" in result.stderr


# --- Man pages ------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
@pytest.mark.parametrize("page", MAN_PAGES)
def test_manPage_rendersWithoutWarnings(page):
    source = REPO / "docs/man" / Path(page).name
    result = run(["groff", "-t", "-man", "-ww", "-z", source])
    assert result.returncode == 0
    assert result.stderr == ""
