"""What one fingerprint unlock costs in system calls (issue 15). The daemon: one write transaction
(the counters, the unlock time and the audit entry together), no commit for a throttle state the
touch left as it was, and one ticket drawn in 8-byte draws rather than one getrandom call per
byte. The PAM module: one password-database lookup of PAM_USER per conversation. Counted with
strace attached to the real daemon, or running pamtester under pam_wrapper, while real
VerifyFinger calls match on libfprint's virtual_device reader.

SQLite takes the WAL write lock (byte 120 of the -shm file, WALINDEX_LOCK_OFFSET) once per write
transaction, so those fcntl calls count the transactions. A miss still commits its counters and
the throttle's new run of unknown fingers, durably, before its answer.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fprint_virtual import environment, scan
from kioskauth_testing import FAST_HASH_CONFIG, Daemon
from pam_support import MODULE, PRELOAD, PamConfig, VarlinkConnection, enroll, module_build

UNLOCKS = 5
WAL_WRITE_LOCK = re.compile(r"fcntl\(\d+, F_SETLKW?, \{l_type=F_WRLCK, l_whence=SEEK_SET, l_start=120, l_len=1\}")


@pytest.fixture
def reader_daemon():
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    d = Daemon(config=FAST_HASH_CONFIG)
    d.sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device", d.sensor, base={}))
    d.start()
    connection = VarlinkConnection(d.socket)
    connection.send({"method": "io.kioskauth.AddPerson", "parameters": {"name": "sarah"}})
    assert "error" not in connection.receive()
    connection.close()
    enroll(d, d.sensor, "sarah", "sarah-finger")
    yield d
    d.close()


def verify(d: Daemon, finger_id: str) -> dict:
    scan(d.sensor, finger_id)  # queued until the scan starts
    connection = VarlinkConnection(d.socket)
    try:
        connection.send({"method": "io.kioskauth.VerifyFinger", "parameters": {"name": "sarah"}, "more": True})
        while True:
            reply = connection.receive()
            if not reply.get("continues"):
                return reply
    finally:
        connection.close()


def traced(d: Daemon, tmp_path: Path, body) -> str:
    """The daemon's fdatasync, fsync, fcntl and getrandom calls (every thread) while `body` runs."""
    out = tmp_path / f"strace-{time.monotonic_ns()}.txt"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-p", str(d.proc.pid), "-o", str(out),
                               "-e", "trace=fdatasync,fsync,fcntl,getrandom"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not out.exists() or out.stat().st_size == 0:
        # strace writes nothing until a call: one status call shows it is attached.
        connection = VarlinkConnection(d.socket)
        connection.send({"method": "io.kioskauth.GetStatus", "parameters": {}})
        connection.receive()
        connection.close()
        assert time.monotonic() < deadline, tracer.stderr.read() if tracer.poll() is not None else "no trace"
        time.sleep(0.2)
    start = out.stat().st_size
    try:
        body()
        time.sleep(0.5)  # the background WAL sync and anchor write of the last unlock
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    return out.read_bytes()[start:].decode(errors="replace")


def fewest_transactions(d: Daemon, tmp_path: Path, body, attempts: int = 2) -> str:
    """The trace of `body` with the fewest write transactions over `attempts` runs: the daemon's
    own periodic write (the steady clock's checkpoint, once a minute) may fall into one."""
    traces = [traced(d, tmp_path, body) for _ in range(attempts)]
    return min(traces, key=lambda t: len(WAL_WRITE_LOCK.findall(t)))


def test_a_fingerprint_unlock_is_one_write_transaction_and_one_ticket_draw(reader_daemon, tmp_path):
    d = reader_daemon
    verify(d, "sarah-finger")  # the throttle state is loaded and cached by the first touch

    replies = []

    def unlocks():
        replies[:] = [verify(d, "sarah-finger") for _ in range(UNLOCKS)]

    trace = fewest_transactions(d, tmp_path, unlocks)

    assert all("error" not in r and r["parameters"]["ticket"] for r in replies), replies
    assert len({r["parameters"]["ticket"] for r in replies}) == UNLOCKS
    transactions = len(WAL_WRITE_LOCK.findall(trace))
    assert transactions == UNLOCKS, f"{transactions} write transactions for {UNLOCKS} unlocks:\n{trace[-3000:]}"
    draws = trace.count("getrandom(")
    assert draws <= 3 * UNLOCKS, f"{draws} getrandom calls for {UNLOCKS} unlocks"
    # The WAL sync and the audit head anchor's, both after the answer, on the background queue.
    syncs = trace.count("fdatasync(") + trace.count("fsync(")
    assert syncs <= 2 * UNLOCKS, f"{syncs} syncs for {UNLOCKS} unlocks"


def test_a_miss_still_commits_the_throttle_state_and_the_next_match_resets_it(reader_daemon, tmp_path):
    d = reader_daemon
    verify(d, "sarah-finger")

    replies = []

    def miss_then_match():
        replies[:] = [verify(d, "someone-else"), verify(d, "sarah-finger")]

    trace = fewest_transactions(d, tmp_path, miss_then_match)

    assert replies[0]["error"] == "io.kioskauth.FingerprintNotRecognized", replies
    assert "error" not in replies[1], replies
    # The miss: its counters and audit entry, and the throttle's run of unknown fingers, each
    # durable before the answer. The match after it: its own record, and the throttle's run
    # reset (it changed, so it is written).
    assert len(WAL_WRITE_LOCK.findall(trace)) == 4, trace[-3000:]
    assert trace.count("fdatasync(") + trace.count("fsync(") >= 2


def test_the_module_looks_pam_user_up_once_per_conversation(reader_daemon, tmp_path):
    """The targetUid sent with the call and the binding check before success ask the same
    question of the password database; with `passwd: files ...` each lookup reads /etc/passwd
    (and a name it does not hold goes on to the other sources)."""
    d = reader_daemon
    module_build()
    config = PamConfig(tmp_path)
    config.add("kiosk", f"auth required {MODULE} socket={d.socket} mode=verify\n")
    scan(d.sensor, "sarah-finger")
    out = tmp_path / "client.txt"
    result = subprocess.run(["timeout", "60", "strace", "-f", "-qq", "-o", str(out), "-e", "trace=openat",
                             # (LeakSanitizer cannot run under ptrace, in `make asan`)
                             "env", "LD_PRELOAD=" + " ".join([*PRELOAD, "libpam_wrapper.so"]), "PAM_WRAPPER=1",
                             "ASAN_OPTIONS=detect_leaks=0",
                             f"PAM_WRAPPER_SERVICE_DIR={config.dir}", "pamtester", "kiosk", "sarah", "authenticate"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert "successfully authenticated" in result.stdout, result
    lookups = out.read_text().count('"/etc/passwd"')
    assert lookups == 1, f"PAM_USER looked up {lookups} times"
