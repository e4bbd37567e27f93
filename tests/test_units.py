"""The systemd units and udev rules, checked by systemd's own tools and against libfprint's own
device lists.

Run: python3 -m pytest tests/test_units.py
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kioskauth_testing import KIOSKAUTHD
from systemd_support import (
    REPO,
    STORE_KEY_CREDENTIAL,
    add_host_units,
    exposure_score,
    read_unit,
    run,
    stage_install,
)

UNITS = ["kioskauthd.socket", "kioskauthd.service", "kioskauthd-store-key.service"]
EXPOSURE_TARGET = 1.5

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """One `make install DESTDIR=... PREFIX=/usr`, plus the host's units for dependencies."""
    install = stage_install(tmp_path_factory.mktemp("units"))
    add_host_units(install.root)
    return install


def verify(root: Path, units: list[str]) -> tuple[int, str]:
    # --root resolves unit files and the executables they name inside the staged tree; MANPATH
    # lets the Documentation= check find the man pages the install put there.
    result = run(
        ["systemd-analyze", "verify", f"--root={root}", *units],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MANPATH": str(root / "usr/share/man")},
    )
    return result.returncode, result.stderr


def security(root: Path, unit: str) -> str:
    result = run(["systemd-analyze", "security", "--offline=yes", f"--root={root}", unit])
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


# --- systemd-analyze verify ---------------------------------------------------------------------


def test_verify_everyUnit_reportsNothing(staged):
    status, stderr = verify(staged.root, UNITS)
    assert stderr == ""
    assert status == 0


def test_verify_whenExecutableMissing_reportsIt(staged, tmp_path):
    # The check above is only worth something if verify really looks inside the staged tree.
    daemon = staged.path("/usr/sbin/kioskauthd")
    moved = tmp_path / "kioskauthd"
    shutil.move(daemon, moved)
    try:
        status, stderr = verify(staged.root, ["kioskauthd.service"])
    finally:
        shutil.move(moved, daemon)
    assert "/usr/sbin/kioskauthd is not executable" in stderr
    assert status != 0


def test_verify_whenManPageMissing_reportsIt(staged, tmp_path):
    page = staged.path("/usr/share/man/man8/kioskauthd.8")
    moved = tmp_path / "kioskauthd.8"
    shutil.move(page, moved)
    try:
        _, stderr = verify(staged.root, ["kioskauthd.socket"])
    finally:
        shutil.move(moved, page)
    assert "man kioskauthd(8)" in stderr


def test_verify_underPrefixUsrLocal_reportsNothing(tmp_path):
    install = stage_install(tmp_path, prefix="/usr/local")
    add_host_units(install.root)
    assert (install.root / "usr/local/lib/systemd/system/kioskauthd.service").is_file()
    # Man pages are under /usr/local/share/man there.
    result = run(
        ["systemd-analyze", "verify", f"--root={install.root}", *UNITS],
        env={"PATH": "/usr/bin:/bin", "MANPATH": str(install.root / "usr/local/share/man")},
    )
    assert result.stderr == ""
    assert result.returncode == 0


# --- systemd-analyze security -------------------------------------------------------------------


def test_security_daemon_exposureAtMostTarget(staged):
    output = security(staged.root, "kioskauthd.service")
    score = exposure_score(output, "kioskauthd.service")
    print(f"kioskauthd.service exposure: {score}")
    assert score <= EXPOSURE_TARGET, output


def test_security_daemonWithIdentityProviderDropIn_exposureAtMostTarget(staged):
    # An administrator who allows the IdP's addresses (the shipped example drop-in) must stay
    # within the target too.
    drop_in = staged.path("/etc/systemd/system/kioskauthd.service.d/idp-network.conf")
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(staged.path("/usr/share/doc/kioskauth/examples/idp-network.conf"), drop_in)
    try:
        output = security(staged.root, "kioskauthd.service")
    finally:
        drop_in.unlink()
    assert "IP address allow list with non-localhost entries" in output  # the drop-in applied
    score = exposure_score(output, "kioskauthd.service")
    print(f"kioskauthd.service exposure with the IdP drop-in: {score}")
    assert score <= EXPOSURE_TARGET, output


@pytest.fixture
def audit_drop_in(staged):
    """The shipped audit-delivery example, installed as an administrator would."""
    drop_in = staged.path("/etc/systemd/system/kioskauthd.service.d/audit-delivery.conf")
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(staged.path("/usr/share/doc/kioskauth/examples/audit-delivery.conf"), drop_in)
    yield drop_in
    drop_in.unlink()


def test_verify_daemonWithAuditDeliveryDropIn_reportsNothing(staged, audit_drop_in):
    status, stderr = verify(staged.root, ["kioskauthd.service"])
    assert stderr == ""
    assert status == 0


def test_security_daemonWithAuditDeliveryDropIn_exposureAtMostTarget(staged, audit_drop_in):
    # Audit delivery needs the network too: the drop-in opens only the collector's addresses and
    # loads the token credential; the rest of the hardening stays as shipped.
    output = security(staged.root, "kioskauthd.service")
    assert "IP address allow list with non-localhost entries" in output  # the drop-in applied
    score = exposure_score(output, "kioskauthd.service")
    print(f"kioskauthd.service exposure with the audit-delivery drop-in: {score}")
    assert score <= EXPOSURE_TARGET, output


def test_auditDeliveryDropIn_keepsTheHardeningAndLoadsTheDocumentedCredential(staged):
    drop_in = read_unit(staged.path("/usr/share/doc/kioskauth/examples/audit-delivery.conf"))
    service = drop_in["Service"]
    # Only the allow list and the credential: nothing that loosens the shipped unit.
    assert set(service) == {"IPAddressAllow", "LoadCredentialEncrypted"}
    credential_id, sealed = service["LoadCredentialEncrypted"][0].split(":", 1)
    assert sealed == f"/etc/credstore.encrypted/{credential_id}"
    # The credential the drop-in loads is the one its instructions name in kioskauthd.conf.
    text = staged.path("/usr/share/doc/kioskauth/examples/audit-delivery.conf").read_text()
    assert f"TokenCredential={credential_id}" in text
    assert f"--name={credential_id}" in text


def test_security_keyUnit_exposureAtMostTarget(staged):
    output = security(staged.root, "kioskauthd-store-key.service")
    assert exposure_score(output, "kioskauthd-store-key.service") <= EXPOSURE_TARGET, output


def test_security_scoreReflectsTheUnit(staged, tmp_path):
    # A unit without the hardening must score far worse, or the parsing above proves nothing.
    weak = staged.path("/etc/systemd/system/kioskauthd.service.d/weak.conf")
    weak.parent.mkdir(parents=True, exist_ok=True)
    weak.write_text("[Service]\nUser=\nProtectSystem=no\nCapabilityBoundingSet=~\n")
    try:
        output = security(staged.root, "kioskauthd.service")
    finally:
        weak.unlink()
    assert exposure_score(output, "kioskauthd.service") > EXPOSURE_TARGET + 1


# --- What the units promise ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def units(staged):
    return {name: read_unit(staged.unit_dir / name) for name in UNITS}


def test_socket_isWorldConnectableAtTheDocumentedPath(units):
    socket = units["kioskauthd.socket"]["Socket"]
    assert socket["ListenStream"] == ["/run/kioskauth/io.kioskauth"]
    assert socket["SocketMode"] == ["0666"]
    assert socket.get("RemoveOnStop", ["no"])[-1] == "no"


def test_service_stopping_keepsTheSocketsDirectory(units):
    # If the service owns the socket's directory as its RuntimeDirectory=, stopping it deletes
    # the directory and the socket with it, unless the directory is preserved.
    listen = Path(units["kioskauthd.socket"]["Socket"]["ListenStream"][0])
    service = units["kioskauthd.service"]["Service"]
    runtime_dirs = [Path("/run") / d for v in service.get("RuntimeDirectory", []) for d in v.split()]
    if listen.parent in runtime_dirs:
        assert service.get("RuntimeDirectoryPreserve", ["no"])[-1] == "yes"


def test_service_isNotifyWithWatchdogAsItsOwnUser(units):
    service = units["kioskauthd.service"]["Service"]
    assert service["Type"] == ["notify"]
    assert service["WatchdogSec"][-1] not in ("", "0", "infinity")
    assert service["User"] == ["kioskauthd"]
    assert service.get("NotifyAccess", ["main"])[-1] == "main"
    unit = units["kioskauthd.service"]["Unit"]
    assert "kioskauthd.socket" in unit["Requires"] and "kioskauthd.socket" in unit["After"]


def test_service_neverUsesSettingsThatBreakTheProduct(units):
    # PrivateUsers= turns every socket peer into nobody; PrivateNetwork= hides udev's netlink
    # events and the identity provider.
    service = units["kioskauthd.service"]["Service"]
    assert service.get("PrivateUsers", ["no"])[-1] in ("no", "false", "0")
    assert service.get("PrivateNetwork", ["no"])[-1] in ("no", "false", "0")
    assert "AF_NETLINK" in service["RestrictAddressFamilies"][-1].split()


def test_service_reachesOnlyReaderDevices(units):
    service = units["kioskauthd.service"]["Service"]
    assert service["DevicePolicy"] == ["closed"]
    allowed = {value.split()[0] for value in service["DeviceAllow"]}
    assert allowed == {"char-usb_device", "char-spi", "char-hidraw"}


def test_service_stateDirectoryIsPrivate(units):
    service = units["kioskauthd.service"]["Service"]
    assert service["StateDirectory"] == ["kioskauth"]
    assert service["StateDirectoryMode"] == ["0700"]


def test_storeKey_unitsAgreeOnWhereTheKeyAndStoreAre(units):
    service = units["kioskauthd.service"]
    key_unit = units["kioskauthd-store-key.service"]
    credential_id, sealed = service["Service"]["LoadCredentialEncrypted"][0].split(":", 1)
    assert credential_id == STORE_KEY_CREDENTIAL
    assert key_unit["Unit"]["ConditionPathExists"] == [f"!{sealed}"]
    _, script_sealed, script_store = key_unit["Service"]["ExecStart"][0].split()
    assert script_sealed == sealed
    state = service["Service"]["StateDirectory"][0]
    assert script_store == f"/var/lib/{state}/kioskauth.sqlite"
    assert "kioskauthd-store-key.service" in service["Unit"]["Requires"]
    assert "kioskauthd-store-key.service" in service["Unit"]["After"]
    assert "kioskauthd.service" in key_unit["Unit"]["Before"]


def test_storeKey_unitChoosesNoPcrBindingByDefault(units):
    # Deliberate: systemd 252 binds PCR 7 by default, so a firmware update would lock the store.
    environment = units["kioskauthd-store-key.service"]["Service"]["Environment"]
    assert "KIOSKAUTH_TPM2_PCRS=" in environment


# --- udev rules -----------------------------------------------------------------------------------

LIBFPRINT_HWDB = Path("/lib/udev/hwdb.d/60-autosuspend-libfprint-2.hwdb")
LIBFPRINT_RULES = Path("/lib/udev/rules.d/70-libfprint-2.rules")


@pytest.fixture(scope="module")
def rules(staged):
    return (staged.path(staged.make_variable("UDEVDIR")) / "rules.d/70-kioskauth.rules").read_text()


def usb_ids_in_rules(text: str) -> set[str]:
    return {
        f"{vid}:{pid}"
        for vid, pid in re.findall(r'ATTR\{idVendor\}=="(\w{4})", ATTR\{idProduct\}=="(\w{4})"', text)
    }


def libfprint_hwdb_sections() -> tuple[set[str], set[str]]:
    """libfprint's own hwdb (generated by its fprint-list-udev-hwdb): supported, known-unsupported."""
    supported, unsupported = set(), set()
    current = supported
    for line in LIBFPRINT_HWDB.read_text().splitlines():
        if line.startswith("# Supported by libfprint driver"):
            current = supported
        elif line.startswith("# Known unsupported devices"):
            current = unsupported
        elif match := re.match(r"usb:v(\w{4})p(\w{4})\*", line):
            current.add(f"{match[1].lower()}:{match[2].lower()}")
    return supported, unsupported


@pytest.mark.skipif(not LIBFPRINT_HWDB.exists(), reason="libfprint's hwdb is not installed")
def test_rules_coverEveryUsbReaderLibfprintSupports(rules):
    ours = usb_ids_in_rules(rules)
    supported, unsupported = libfprint_hwdb_sections()
    assert len(supported) > 50
    assert supported <= ours, f"missing: {sorted(supported - ours)}"
    assert not (ours & unsupported), f"known-unsupported: {sorted(ours & unsupported)}"


@pytest.mark.skipif(not LIBFPRINT_RULES.exists(), reason="libfprint's udev rules are not installed")
def test_rules_coverEverySpiReaderLibfprintBinds(rules):
    acpi_ids = set(re.findall(r'MODALIAS\}=="acpi:(\w+):"', LIBFPRINT_RULES.read_text()))
    assert acpi_ids, "libfprint's rules name no SPI readers"
    for acpi_id in acpi_ids:
        assert f'DEVPATH=="*{acpi_id}*", ENV{{KIOSKAUTH_READER}}="1"' in rules


def test_rules_grantReadersAndStartTheDaemon(rules):
    assert 'ENV{KIOSKAUTH_READER}=="1", TAG+="systemd", ENV{SYSTEMD_WANTS}+="kioskauthd.service"' in rules
    assert re.search(r'ENV\{KIOSKAUTH_READER\}=="1".*GROUP="kioskauthd"', rules)


def test_rules_areWellFormed(rules):
    token = re.compile(
        r'\s*(?P<key>[A-Z]+)(\{(?P<attr>[^}]+)\})?\s*(?P<op>==|!=|\+=|-=|:=|=)\s*"(?P<value>[^"]*)"\s*'
    )
    labels, gotos = [], []
    for number, line in enumerate(rules.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert "@" not in line, f"line {number}: unsubstituted marker: {line}"
        position = 0
        while position < len(line):
            match = token.match(line, position)
            assert match, f"line {number}: cannot parse {line[position:]!r}"
            key = match["key"]
            assert key in {
                "ACTION", "SUBSYSTEM", "SUBSYSTEMS", "KERNELS", "DEVPATH", "ATTR", "ENV", "TAG",
                "GROUP", "MODE", "GOTO", "LABEL",
            }, f"line {number}: unexpected key {key}"
            if key == "LABEL":
                labels.append(match["value"])
            if key == "GOTO":
                gotos.append(match["value"])
            position = match.end()
            if position < len(line):
                assert line[position] == ",", f"line {number}: expected a comma at {position}"
                position += 1
    assert len(labels) == len(set(labels))
    assert set(gotos) <= set(labels)


def test_ruleGenerator_whenTemplateLacksMarker_fails(staged, tmp_path):
    template = tmp_path / "broken.rules.in"
    template.write_text("@LIBFPRINT_VERSION@\n@USB_MATCHES@\n")
    result = run([staged.build / "udev/kioskauth-reader-rules", template])
    assert result.returncode != 0
    assert "must contain" in result.stderr
    assert result.stdout.count("ATTR{idVendor}") > 50  # it got that far, and still refuses


def test_ruleGenerator_namesTheLibfprintItReadAtBuildTime(rules):
    version = run(["pkg-config", "--modversion", "libfprint-2"]).stdout.strip()
    assert f"Generated from the driver tables of libfprint {version}." in rules


def test_ruleSources_areNotAHandKeptList():
    # The committed template holds the policy only; IDs come from libfprint at build time.
    template = (REPO / "udev/70-kioskauth.rules.in").read_text()
    assert "idVendor" not in template and "ELAN" not in template


# --- The fleet helper under the unit's system-call filter ---------------------------------------

SECCOMP_HARNESS = r"""
import os, sys, seccomp
allowed, program = sys.argv[1].split(","), sys.argv[2:]
# SystemCallErrorNumber=EPERM: what the filter does not allow fails with EPERM.
f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(1))
for name in allowed:
    try:
        f.add_rule(seccomp.ALLOW, name)
    except (ValueError, RuntimeError):
        pass  # a name this libseccomp does not know (none of the helper's calls)
f.load()
os.execv(program[0], program)
"""


def syscall_groups() -> dict[str, list[str]]:
    """systemd's system-call groups, as `systemd-analyze syscall-filter` lists them."""
    listing = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True,
                             check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in listing.splitlines():
        if line.startswith("@"):
            current = line.split()[0]
            groups[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            groups[current].append(line.split()[0])
    return groups


def unit_syscalls(lines: list[str]) -> set[str]:
    """What a unit's SystemCallFilter= lines allow: the first allow list, plus later allow lists,
    minus the deny lists (`~`), in order, as systemd applies them."""
    groups = syscall_groups()

    def expand(names: list[str]) -> set[str]:
        found: set[str] = set()
        for name in names:
            found |= expand(groups[name]) if name.startswith("@") else {name}
        return found

    allowed: set[str] = set()
    for line in lines:
        if line.startswith("~"):
            allowed -= expand(line[1:].split())
        else:
            allowed |= expand(line.split())
    return allowed


def run_helper_under(allowed: set[str], *args: str):
    helper = KIOSKAUTHD.parent / "kioskauth-fleet"
    return subprocess.run(["/usr/bin/python3", "-c", SECCOMP_HARNESS, ",".join(sorted(allowed)), str(helper), *args],
                          capture_output=True, text=True, timeout=60)


def test_service_letsTheFleetHelperConfineItself(units):
    """The unit's own filter (SystemCallErrorNumber=EPERM) around the helper's confinement: with
    Landlock's calls missing from it (systemd 252's @system-service lacks them), the helper
    refuses to start, and every fleet operation would fail."""
    lines = units["kioskauthd.service"]["Service"]["SystemCallFilter"]
    assert units["kioskauthd.service"]["Service"]["SystemCallErrorNumber"] == ["EPERM"]
    allowed = unit_syscalls(lines)
    checked = run_helper_under(allowed, "--sandbox-check", "/etc/hosts", "/var/lib")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines() == ["/etc/hosts\tallowed", "/var/lib\tdenied (Permission denied)"]
    # The same filter without the unit's Landlock line: refused, and said why.
    without = run_helper_under(unit_syscalls([line for line in lines if "landlock" not in line]), "--sandbox-check",
                               "/etc/hosts")
    assert without.returncode == 64 and "Landlock" in without.stderr, without


def test_service_letsAPasscodeHashRunRaised(units, make_daemon):
    """Under the unit's system-call filter, as an unprivileged user that may lower a nice value
    (CAP_SYS_NICE here; the unit's LimitNICE=-10 in service), a passcode hash runs at -10
    (test_hashing_priority.py). Without the unit's `setpriority` line, @resources' denial would
    refuse it: said once, and passcodes still verify at the daemon's own priority."""
    from test_hashing_priority import add_people, hash_config, nices_while_verifying, unprivileged

    service = units["kioskauthd.service"]["Service"]
    assert service["LimitNICE"] == ["-10"]
    lines = service["SystemCallFilter"]
    for allowed, raised in ((unit_syscalls(lines), True),
                            (unit_syscalls([line for line in lines if line != "setpriority"]), False)):
        d = make_daemon(config=hash_config())
        unprivileged(d, nice_capability=True,
                     wrapper=("/usr/bin/python3", "-c", SECCOMP_HARNESS, ",".join(sorted(allowed))))
        d.start()
        add_people(d)
        hashing, others, after = nices_while_verifying(d)
        assert after == [0, 0] and min(others) >= -4, (after, others)
        assert (-10 in hashing) == raised, hashing
        assert ("setpriority was refused (a system-call filter" in d.log_text()) == (not raised), d.log_text()
        d.stop()
