"""kioskauthctl as a new user meets it: the audit tail and shell completion (issue #14, part 6)."""

import json
import subprocess

from kioskauth_testing import KIOSKAUTHCTL, as_user


def complete(d, subcommands, argument, words, user=None):
    """Runs the completion callback exactly as the generated bash script does:
    `kioskauthctl ---completion SUBCOMMAND... -- ARGUMENT CWORD CURSOR WORD...`, completing the last word."""
    cmd = [str(KIOSKAUTHCTL), "---completion", *subcommands, "--", argument, str(len(words) - 1),
           str(len(words[-1])), *words]
    return subprocess.run(as_user(cmd, user), capture_output=True, text=True, timeout=30,
                          env={"KIOSKAUTH_SOCKET": d.socket, "PATH": "/usr/bin:/bin"})


def test_audit_limit_shows_the_newest_events_oldest_first(daemon):
    for name in ("ada", "bo", "cy", "di"):
        assert daemon.ctl("user", "add", name).returncode == 0
    every = json.loads(daemon.ctl("audit", "--json").stdout)["events"]
    assert len(every) > 3
    newest = json.loads(daemon.ctl("audit", "--json", "--limit", "3").stdout)["events"]
    assert [e["sequence"] for e in newest] == [e["sequence"] for e in every[-3:]]
    # The plain listing too, and -n as in journalctl.
    lines = daemon.ctl("audit", "-n", "2").stdout.splitlines()
    assert [int(line.split("\t")[0]) for line in lines] == [e["sequence"] for e in every[-2:]]
    assert "person=di" in lines[-1]
    # --after still pages forward; with --limit it is the newest of those after it.
    after = json.loads(daemon.ctl("audit", "--json", "--after", str(every[0]["sequence"])).stdout)["events"]
    assert after == every[1:]
    assert daemon.ctl("audit", "--limit", "0").returncode == 2


def test_completion_offers_people_to_admins_and_nothing_to_others(daemon):
    for name in ("sarah", "sam", "omar"):
        assert daemon.ctl("user", "add", name).returncode == 0
    r = complete(daemon, ["user", "show"], "positional@0", ["kioskauthctl", "user", "show", "sa"])
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["sam", "sarah"]
    r = complete(daemon, ["finger", "enroll"], "positional@0", ["kioskauthctl", "finger", "enroll", ""])
    assert sorted(r.stdout.split()) == ["omar", "sam", "sarah"]
    # --socket on the command line wins over the environment.
    r = subprocess.run([str(KIOSKAUTHCTL), "---completion", "lockout", "reset", "--", "positional@0", "4", "1",
                        "kioskauthctl", "--socket", daemon.socket, "lockout", "reset", "o"],
                       capture_output=True, text=True, timeout=30, env={"KIOSKAUTH_SOCKET": "/nonexistent"})
    assert r.returncode == 0 and r.stdout.split() == ["omar"], r

    # Someone the daemon does not let list people gets no candidates, and no error.
    r = complete(daemon, ["user", "show"], "positional@0", ["kioskauthctl", "user", "show", ""], user="nobody")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    # Nor when no daemon answers.
    r = subprocess.run([str(KIOSKAUTHCTL), "---completion", "user", "show", "--", "positional@0", "3", "0",
                        "kioskauthctl", "user", "show", ""],
                       capture_output=True, text=True, timeout=30, env={"KIOSKAUTH_SOCKET": "/nonexistent"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_the_generated_bash_completion_completes_names(daemon, tmp_path):
    """The real bash script, driven the way bash drives it (COMP_WORDS, COMP_CWORD, ...)."""
    assert daemon.ctl("user", "add", "sarah").returncode == 0
    script = subprocess.run([str(KIOSKAUTHCTL), "--generate-completion-script", "bash"], capture_output=True,
                            text=True, check=True).stdout
    (tmp_path / "completion.bash").write_text(script)
    line = "kioskauthctl passcode set s"
    driver = f"""
source {tmp_path / 'completion.bash'}
COMP_WORDS=(kioskauthctl passcode set s); COMP_CWORD=3; COMP_LINE='{line}'; COMP_POINT={len(line)}
_kioskauthctl kioskauthctl s set
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, timeout=30,
                       env={"KIOSKAUTH_SOCKET": daemon.socket, "PATH": f"{KIOSKAUTHCTL.parent}:/usr/bin:/bin"})
    assert r.stdout.split() == ["sarah"], (r.stdout, r.stderr)
