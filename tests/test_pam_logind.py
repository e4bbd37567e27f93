"""pam/logind.c against libsystemd: the module reads the caller's logind session and whether it is
remote without linking libsystemd (whose loading cost every PAM conversation more than the rest of
the module's work), so its answers must be libsystemd's.

Both run in the same process tree and the same cgroup, on this machine's real cgroup hierarchy
and a real /run/systemd/sessions file: in a private mount namespace (unshare -m) the process moves
itself into a cgroup-v2 group named as the case says, and a tmpfs over /run/systemd carries the
session file (nothing outside the namespace sees it). libsystemd's answer comes from
sd_pid_get_session() and sd_session_is_remote() through ctypes, the module's from the same two
questions asked of pam/logind.c, compiled into a small probe. The end-to-end path (the module
telling the daemon, the daemon refusing a remote passcode) is tests/test_binding.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TAG = f"kalogind{os.getpid()}"

PROBE_C = r"""
#include <stdio.h>
#include "logind.h"
int main(void) {
    char id[LOGIND_SESSION_ID_MAX];
    int r = logind_own_session(id, sizeof(id));
    if (r < 0) { printf("session=%d remote=-\n", r); return 0; }
    printf("session=%s remote=%d\n", id, logind_session_is_remote(id));
    return 0;
}
"""

LIBSYSTEMD = """
import ctypes
sd = ctypes.CDLL("libsystemd.so.0")
session = ctypes.c_char_p()
r = sd.sd_pid_get_session(0, ctypes.byref(session))
if r < 0:
    print(f"session={r} remote=-")
else:
    print(f"session={session.value.decode()} remote={sd.sd_session_is_remote(session.value)}")
"""

# Moves the shell into cgroup $GROUP (relative to the cgroup-v2 root; none: stays where it is),
# puts $SESSION_FILE (if set) at /run/systemd/sessions/$SESSION_NAME on a private tmpfs, runs "$@".
IN_GROUP = """set -e
if [ -n "$GROUP" ]; then
  cg=$(mktemp -d)
  mount -t cgroup2 none "$cg"
  mkdir -p "$cg/$GROUP"
  echo $$ > "$cg/$GROUP/cgroup.procs"
  umount "$cg"
  rmdir "$cg"
fi
mount -t tmpfs tmpfs /run/systemd
mkdir /run/systemd/sessions
if [ -n "$SESSION_FILE" ]; then printf '%s' "$SESSION_FILE" > "/run/systemd/sessions/$SESSION_NAME"; fi
exec "$@"
"""

SLICES = f"{TAG}.slice/{TAG}-4242.slice"
# (cgroup, session file name, its content): every case is asked of both.
CASES = {
    "remote session under slices": (f"{SLICES}/session-{TAG}.scope", TAG, "REMOTE=1\nTYPE=tty\n"),
    "local session under slices": (f"{SLICES}/session-{TAG}.scope", TAG, "TYPE=x11\nREMOTE=0\n"),
    "session with no slice above it": (f"session-{TAG}.scope", TAG, "REMOTE=1\n"),
    "a group inside the session scope": (f"{SLICES}/session-{TAG}.scope/inner", TAG, "REMOTE=1\n"),
    "escaped session scope": (f"{SLICES}/_session-{TAG}.scope", TAG, "REMOTE=1\n"),
    "dotted slice name": (f"{TAG}.a.b.slice/session-{TAG}.scope", TAG, "REMOTE=0\n"),
    "quoted and spaced value": (f"{SLICES}/session-{TAG}.scope", TAG, '  REMOTE = "yes" \n'),
    "last assignment wins": (f"{SLICES}/session-{TAG}.scope", TAG, "REMOTE=1\nREMOTE=0\n"),
    "no session file": (f"{SLICES}/session-{TAG}.scope", None, None),
    "no REMOTE in the session file": (f"{SLICES}/session-{TAG}.scope", TAG, "TYPE=tty\n"),
    "empty REMOTE": (f"{SLICES}/session-{TAG}.scope", TAG, "REMOTE=\n"),
    "REMOTE not a boolean": (f"{SLICES}/session-{TAG}.scope", TAG, "REMOTE=maybe\n"),
    "user manager, not a session": (f"{SLICES}/user@4242.service/app.slice/x.scope", None, None),
    "session id with a character logind never uses": (f"{SLICES}/session-{TAG}_x.scope", None, None),
    "an instance named like a slice above the session": (f"{TAG}@x.slice/session-{TAG}.scope", TAG, "REMOTE=1\n"),
    "a scope that is not a session": (f"{SLICES}/{TAG}.scope", None, None),
    "this machine as it is (no logind session)": ("", None, None),
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    directory = tmp_path_factory.mktemp("logind")
    source = directory / "probe.c"
    source.write_text(PROBE_C)
    binary = directory / "probe"
    subprocess.run(["cc", "-std=gnu11", "-O2", "-Wall", "-Werror", f"-I{REPO / 'pam'}", "-o", str(binary),
                    str(source), str(REPO / "pam" / "logind.c")], check=True)
    yield binary
    # Remove the groups the cases made (deepest first; a group is removable once its process has
    # exited).
    groups = sorted({c for c, _, _ in CASES.values() if c}, key=lambda c: -c.count("/"))
    script = 'set -e; cg=$(mktemp -d); mount -t cgroup2 none "$cg"; for g in "$@"; do p="$g"; ' \
             'while [ -n "$p" ] && [ "$p" != . ]; do rmdir "$cg/$p" 2>/dev/null || true; p=$(dirname "$p"); ' \
             'done; done; umount "$cg"; rmdir "$cg"'
    subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *groups])


def ask(command: list[str], group: str, name: str | None, content: str | None) -> str:
    env = {**os.environ, "GROUP": group, "SESSION_NAME": name or "", "SESSION_FILE": content or ""}
    result = subprocess.run(["unshare", "-m", "sh", "-c", IN_GROUP, "sh", *command], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("case", list(CASES))
def test_the_module_reads_the_session_as_libsystemd_does(probe, case):
    group, name, content = CASES[case]
    ours = ask([str(probe)], group, name, content)
    theirs = ask(["python3", "-c", LIBSYSTEMD], group, name, content)
    assert ours == theirs, f"{case}: pam/logind.c says {ours!r}, libsystemd {theirs!r}"


def test_the_cases_cover_every_answer(probe):
    """Remote, local, no session, no session file, no value, a bad value: each answer appears."""
    answers = {ask([str(probe)], *CASES[case]) for case in CASES}
    assert f"session={TAG} remote=1" in answers
    assert f"session={TAG} remote=0" in answers
    assert any(a.startswith("session=-61 ") for a in answers)  # ENODATA: in no session
    assert f"session={TAG} remote=-6" in answers  # ENXIO: no session file
    assert f"session={TAG} remote=-61" in answers  # ENODATA: no REMOTE
    assert f"session={TAG} remote=-22" in answers  # EINVAL: not a boolean


def test_the_module_does_not_link_libsystemd():
    subprocess.run(["make", "-s", "-C", str(REPO / "pam"), "pam_kioskauth.so"], check=True, timeout=120)
    needed = subprocess.run(["readelf", "-d", str(REPO / "pam" / "pam_kioskauth.so")], capture_output=True,
                            text=True, check=True).stdout
    assert "libsystemd" not in needed
