"""Start-up binds the socket early: the event loop's thread binds it while the store is opened
and checked (issue #15, cold start), and calls are served only once the daemon is ready.

A debug-build hook (KIOSKAUTH_TEST_START_DELAY) holds start-up with the socket bound and the
store not yet opened, so these tests can connect inside that window every time:

* a call made then is answered once the daemon is ready, after READY=1, not before;
* a start that is then refused (here: the store key does not open the store) closes the calls
  waiting, exits 78 and leaves no socket file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kioskauth_testing import FAST_HASH_CONFIG, Daemon

HOLD = 1.5  # seconds start-up holds with the socket bound


def wait_for_path(path: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def read_reply(client: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\0"):
        chunk = client.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_call_made_before_ready_is_answered_once_the_daemon_is_ready():
    daemon = Daemon(config=FAST_HASH_CONFIG, env={"KIOSKAUTH_TEST_START_DELAY": str(HOLD)})
    try:
        daemon.start(expect_ready=False)
        wait_for_path(daemon.socket)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(30)
            client.connect(daemon.socket)
            sent = time.monotonic()
            client.sendall(b'{"method":"io.kioskauth.GetStatus"}\0')
            # Start-up is held: nothing is ready, and nothing is answered.
            assert not daemon.notify.wait_for("READY=1", 0.2), "READY=1 before start-up went on"
            reply = read_reply(client)
            answered = time.monotonic()
        assert reply.endswith(b"\0"), reply
        status = json.loads(reply[:-1])
        assert "error" not in status and "parameters" in status, status
        # READY=1 was sent before the call was handed to the server, so it is already there.
        assert daemon.notify.wait_for("READY=1", 0.01), daemon.log_text()
        # Answered once start-up went on, not by a daemon still starting.
        assert answered - sent >= HOLD - 0.3, (answered - sent, daemon.log_text())
        # And the daemon serves as usual afterwards.
        assert "error" not in daemon.call("io.kioskauth.GetStatus"), daemon.log_text()
        assert daemon.stop() == 0
        assert not os.path.exists(daemon.socket)
    finally:
        daemon.close()


def test_a_start_refused_after_the_bind_closes_waiting_calls_and_leaves_no_socket():
    key = os.urandom(32)
    first = Daemon(config=FAST_HASH_CONFIG, credential_key=key).start()
    try:
        assert "error" not in first.call("io.kioskauth.AddPerson", {"name": "sarah"})
        assert first.stop() == 0
        # The same state, started with another key: the store does not open.
        key_file = Path(first.credentials) / "kioskauth.store-key"
        key_file.chmod(0o600)
        key_file.write_bytes(os.urandom(32))
        first.extra_env["KIOSKAUTH_TEST_START_DELAY"] = str(HOLD)
        first.start(expect_ready=False)
        wait_for_path(first.socket)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(30)
            client.connect(first.socket)
            client.sendall(b'{"method":"io.kioskauth.GetStatus"}\0')
            # No answer: the connection is closed (an end of file or a reset), never left hanging.
            try:
                assert read_reply(client) == b""
            except ConnectionResetError:
                pass
        assert first.wait_exit() == 78, first.log_text()
        assert not first.notify.wait_for("READY=1", 0.01)
        assert not os.path.exists(first.socket), "the refused start left its socket behind"
        assert "does not open this store" in first.log_text()
    finally:
        first.close()


@contextlib.contextmanager
def two_daemons_on_one_path():
    """A running daemon, and a second one (not started) with the same runtime directory, so the
    same socket path, but a store of its own: only the socket is at stake between them."""
    first = Daemon(config=FAST_HASH_CONFIG).start()
    second = Daemon(config=FAST_HASH_CONFIG)
    second.runtime = first.runtime
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def test_a_second_daemon_leaves_the_socket_of_the_one_serving_it_alone():
    with two_daemons_on_one_path() as (first, second):
        before = os.stat(first.socket)
        second.start(expect_ready=False)
        assert second.wait_exit() != 0, second.log_text()
        # Refused at the path's lock, which the serving daemon holds, before looking at the file.
        assert "is served, or being set up, by another kioskauthd" in second.log_text(), second.log_text()
        assert not second.notify.wait_for("READY=1", 0.01)
        # The first daemon keeps its socket file, and answers on it.
        after = os.stat(first.socket)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        assert "error" not in first.call("io.kioskauth.GetStatus"), first.log_text()
        # A stale socket file (nobody accepts on it) is still replaced.
        assert first.stop() == 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
            stale.bind(first.socket)  # bound, never listening: a crashed daemon's leftover
        first.start()
        assert "error" not in first.call("io.kioskauth.GetStatus"), first.log_text()


def test_two_daemons_starting_at_once_on_a_leftover_socket_leave_one_served_socket():
    # A crashed daemon's socket file is at the path, and two daemons start at once (separate
    # stores, one runtime directory): both used to find the file stale, and the later unlink
    # took away the socket the other had just bound, which then served nobody while its daemon
    # ran on. The debug hook holds a daemon between finding the file stale and removing it, so
    # the second daemon starts inside that window every time. Now only the one holding the
    # path's lock looks at the file; the other is refused at once and touches nothing.
    pause = {"KIOSKAUTH_TEST_STALE_SOCKET_PAUSE": str(HOLD)}
    first = Daemon(config=FAST_HASH_CONFIG, env=pause)
    second = Daemon(config=FAST_HASH_CONFIG, env=pause)
    second.runtime = first.runtime
    try:
        first.runtime.mkdir(parents=True, exist_ok=True)
        first.runtime.chmod(0o755)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
            stale.bind(first.socket)  # bound, never listening
        first.start(expect_ready=False)
        time.sleep(HOLD / 3)  # the first is inside the window (or past its lock)
        second.start(expect_ready=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(d.notify.wait_for("READY=1", 0.05) for d in (first, second)):
            pass
        # Whichever got the lock serves; the other is refused and exits, never ready (without
        # the lock both became ready, one of them on a socket file that was gone).
        time.sleep(HOLD + 1)
        ready = [d for d in (first, second) if d.notify.wait_for("READY=1", 0.01)]
        assert len(ready) == 1, first.log_text() + second.log_text()
        (winner,) = ready
        loser = second if winner is first else first
        assert loser.wait_exit() != 0, loser.log_text()
        assert "being set up, by another kioskauthd" in loser.log_text(), loser.log_text()
        assert "error" not in winner.call("io.kioskauth.GetStatus"), winner.log_text()
        # The socket file is the winner's: its stop removes it, and a new start binds afresh.
        assert winner.stop() == 0
        assert not os.path.exists(first.socket)
        loser.start()
        assert "error" not in loser.call("io.kioskauth.GetStatus"), loser.log_text()
    finally:
        second.close()
        first.close()


def test_an_unprivileged_user_cannot_hold_the_socket_lock_to_keep_the_daemon_from_starting():
    # The lock file sits in the world-searchable runtime directory. Were anyone able to open it,
    # an unprivileged user could take its flock (a read-only descriptor is enough) and hold it
    # across the daemon's restart, which would then be refused as "served by another
    # kioskauthd". Only the daemon's user may open it.
    # A lock file others may read is there already (made by hand, or by a build that created
    # it 0644): the daemon makes it its own user's alone before it takes the lock.
    daemon = Daemon(config=FAST_HASH_CONFIG)
    daemon.runtime.mkdir(parents=True, exist_ok=True)
    daemon.runtime.chmod(0o755)
    lock_file = daemon.socket + ".lock"
    os.close(os.open(lock_file, os.O_CREAT | os.O_WRONLY, 0o644))
    os.chmod(lock_file, 0o644)
    holder = None
    try:
        daemon.start()
        assert os.stat(lock_file).st_mode & 0o777 == 0o600
        assert daemon.stop() == 0
        # As nobody: open the lock file, take its lock, and keep it while the daemon starts.
        script = ("import fcntl, os, sys, time\n"
                  "try:\n"
                  "    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                  "except PermissionError:\n"
                  "    print('refused', flush=True); sys.exit(0)\n"
                  "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                  "print('held', flush=True); time.sleep(60)\n")
        holder = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                                   "/usr/bin/python3", "-c", script, lock_file], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "refused"
        daemon.start()
        assert "error" not in daemon.call("io.kioskauth.GetStatus"), daemon.log_text()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        daemon.close()


def test_a_daemon_refused_at_the_socket_lock_has_touched_neither_the_store_nor_the_reader():
    # The lock is taken before the reader starts and the store is opened: a second daemon with
    # the same runtime and state directories is refused before it claims the reader (which the
    # serving daemon would then lose) or checks, migrates or checkpoints the store.
    first = Daemon(config=FAST_HASH_CONFIG).start()
    second = Daemon(config=FAST_HASH_CONFIG)
    second.runtime, second.state = first.runtime, first.state
    try:
        store = first.state / "kioskauth.sqlite"
        before = os.stat(store)
        second.start(expect_ready=False)
        assert second.wait_exit() != 0, second.log_text()
        log = second.log_text()
        assert "being set up, by another kioskauthd" in log, log
        assert "fingerprint readers" not in log and "store checked" not in log, log
        after = os.stat(store)
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
        assert "error" not in first.call("io.kioskauth.GetStatus"), first.log_text()
    finally:
        second.close()
        first.close()


def test_the_store_files_are_private_in_an_open_state_directory():
    # The socket is bound on another thread while the store creates its files: nothing may
    # change the process's umask meanwhile (the bind used to set 0111 around itself). This
    # checks the modes the daemon must end with; it cannot force that old race to happen.
    daemon = Daemon(config=FAST_HASH_CONFIG)
    daemon.state.mkdir(parents=True, exist_ok=True)
    daemon.state.chmod(0o755)
    try:
        daemon.start()
        assert "error" not in daemon.call("io.kioskauth.AddPerson", {"name": "sarah"})
        for name in os.listdir(daemon.state):
            if name.startswith("kioskauth.sqlite"):
                mode = os.stat(daemon.state / name).st_mode & 0o777
                assert mode & 0o077 == 0, f"{name} is {oct(mode)}"
        assert os.stat(daemon.socket).st_mode & 0o777 == 0o666
    finally:
        daemon.close()


def test_a_daemon_that_stops_removes_its_own_socket_file_only():
    with two_daemons_on_one_path() as (first, second):
        # Someone removed the first daemon's socket file. A second daemon still may not take
        # the path while the first runs (it holds the path's lock)...
        os.unlink(first.socket)
        second.start(expect_ready=False)
        assert second.wait_exit() != 0, second.log_text()
        assert "being set up, by another kioskauthd" in second.log_text(), second.log_text()
        assert not os.path.exists(second.socket)
        # ...but another program may bind it: the first daemon's exit leaves that socket alone.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
            other.bind(first.socket)
            other.listen(1)
            before = os.stat(first.socket)
            assert first.stop() == 0
            after = os.stat(first.socket)
            assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        os.unlink(first.socket)
        # Once the first has exited, the path is free again: the second binds it, and removes
        # it when it stops.
        second.start()
        assert "error" not in second.call("io.kioskauth.GetStatus"), second.log_text()
        assert second.stop() == 0
        assert not os.path.exists(second.socket)


def test_a_runtime_directory_others_can_change_is_refused():
    # Whoever can replace entries in the socket's directory could swap the socket for a link:
    # a directory another (unprivileged) user owns, or one its group may write to without the
    # sticky bit, is refused before anything is bound in it.
    for owner, mode in ((65534, 0o755), (0, 0o775)):
        daemon = Daemon(config=FAST_HASH_CONFIG)
        try:
            daemon.runtime.mkdir(parents=True, exist_ok=True)
            os.chown(daemon.runtime, owner, 0)
            daemon.runtime.chmod(mode)
            daemon.start(expect_ready=False)
            assert daemon.wait_exit() != 0, daemon.log_text()
            assert "is not a safe directory for the socket" in daemon.log_text(), daemon.log_text()
            assert not os.path.exists(daemon.socket)
        finally:
            daemon.close()


def traced_start(tmp_path: Path, daemon: Daemon) -> list[str]:
    """Starts `daemon` under strace and returns the trace lines up to READY=1 (every thread:
    opens, syncs and the datagram that carries READY=1); the daemon keeps serving."""
    out = tmp_path / f"strace-{time.monotonic_ns()}.txt"
    daemon.prefix = ["strace", "-f", "-qq", "-e", "signal=none", "-o", str(out),
                     "-e", "trace=openat,fdatasync,fsync,sendto,sendmsg"]
    daemon.start()
    # READY=1 can arrive before strace has written the line of the call that sent it (strace
    # writes a call's line when it returns): read again until that line is complete.
    deadline = time.monotonic() + 20
    while True:
        lines = joined(out.read_text(errors="replace").splitlines())
        ready = next((i for i, line in enumerate(lines) if "READY=1" in line and re.search(r"=\s*\d+$", line)), None)
        if ready is not None:
            return lines[:ready]
        assert time.monotonic() < deadline, "strace never wrote the call that sent READY=1"
        time.sleep(0.05)


def joined(lines: list[str]) -> list[str]:
    """strace's lines with each call whole: a call another thread interrupted is written as
    `… <unfinished ...>` and later `TID <... NAME resumed>…`; it is put together where it began."""
    result: list[str] = []
    open_calls: dict[str, int] = {}
    for line in lines:
        tid = line.split(" ", 1)[0]
        if line.endswith("<unfinished ...>"):
            open_calls[tid] = len(result)
            result.append(line[: -len("<unfinished ...>")].rstrip())
        elif " <... " in line and tid in open_calls:
            index = open_calls.pop(tid)
            result[index] += line.split(" resumed>", 1)[1]
        else:
            result.append(line)
    return result


def stop_traced(daemon: Daemon) -> None:
    """SIGTERM to the daemon itself (strace, its parent, would pass nothing on), then waits."""
    assert daemon.proc is not None
    children = subprocess.run(["pgrep", "-P", str(daemon.proc.pid)], capture_output=True, text=True).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGTERM)
    assert daemon.proc.wait(timeout=30) == 0


def test_nothing_written_on_the_way_to_ready_waits_for_an_fsync_of_its_own(tmp_path):
    """Before READY=1 the daemon records its start in the audit trail and stores the offline
    window and the steady clock it observed; each of those commits used to wait for its own
    sync of the WAL (four syncs of SQLite's WAL descriptor before READY=1, where a kiosk's
    flash takes milliseconds for each). Now none does: the only sync left on that descriptor
    is SQLite's own of a new WAL's header. The writes still become durable, in order, right
    after (the background WAL sync), and a clean stop loses none of them."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    daemon = Daemon(config=FAST_HASH_CONFIG)
    try:
        daemon.start()  # creates the store: its schema and anchor are written durably once
        assert daemon.ctl("user", "add", "sarah").returncode == 0
        daemon.stop()
        for _ in range(2):
            before_ready = traced_start(tmp_path, daemon)
            # (a call another thread interrupted is joined with padding before its result)
            wal = re.compile(r'openat\(AT_FDCWD, "[^"]*/kioskauth\.sqlite-wal", O_RDWR[^)]*\)\s*= (\d+)')
            wal_fds = {m.group(1) for line in before_ready if (m := wal.search(line))}
            assert wal_fds, "\n".join(before_ready[-40:])
            syncs = [line for line in before_ready
                     if re.search(r"\b(fdatasync|fsync)\((" + "|".join(wal_fds) + r")\b", line)]
            assert len(syncs) <= 1, "\n".join(syncs)
            assert daemon.call("io.kioskauth.GetStatus").get("error") is None
            stop_traced(daemon)
        daemon.prefix = []
        daemon.start()
        events = json.loads(daemon.ctl("audit", "--json", "--limit", "100").stdout)["events"]
        assert [e["action"] for e in events].count("daemon.start") == 4, events
        assert daemon.ctl("audit", "verify").returncode == 0
    finally:
        daemon.close()



def test_a_drop_in_directory_that_cannot_be_listed_stops_start_up_with_78():
    """A `kioskauthd.conf.d` the daemon cannot list is refused with its path, not skipped: the
    drop-in left out could be the one that narrows who may do what."""
    d = Daemon()
    try:
        drop_ins = Path(str(d.config_path) + ".d")
        drop_ins.write_text("[Access]\nPasscodeServices=\n")  # a file, not a directory
        d.start(expect_ready=False)
        assert d.wait_exit() == 78, d.log_text()
        assert not d.notify.wait_for("READY=1", 0.01)
        assert f"configuration: {drop_ins}:0: cannot list: Not a directory" in d.log_text()
    finally:
        d.close()


def test_the_part_of_bss_a_start_touches_is_made_resident_only_when_linked_together():
    """kioskauthd makes the .bss input sections a start touches resident in one call at the top
    of main, when the package's symbol order linked them together at the start of .bss (between
    kioskauth_hot_bss_start and kioskauth_hot_bss_end); linked without it (a development build),
    they lie anywhere, and nothing is made resident. The ready line says which."""
    from kioskauth_testing import KIOSKAUTHD

    listing = subprocess.run(["nm", "--defined-only", str(KIOSKAUTHD)], capture_output=True, text=True).stdout
    wanted = ("__bss_start", "kioskauth_hot_bss_start", "kioskauth_hot_bss_end")
    address = {fields[2]: int(fields[0], 16) for fields in (line.split() for line in listing.splitlines())
               if len(fields) == 3 and fields[2] in wanted}
    if len(address) < len(wanted):
        pytest.skip(f"{KIOSKAUTHD} has no symbol table to tell how it was linked")
    ordered = address["kioskauth_hot_bss_start"] == address["__bss_start"]
    daemon = Daemon()
    try:
        daemon.start()
    finally:
        daemon.stop()  # the ready line is written just after READY=1: read it once the daemon is gone
        log = daemon.log_text()
        daemon.close()
    reported = re.search(r" ready .*\bhot_bss=(\S+)", log).group(1)
    if not ordered:
        assert reported == "unordered", log
        return
    if reported == "EINVAL":
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
    span = address["kioskauth_hot_bss_end"] + 1 - address["kioskauth_hot_bss_start"]
    assert 0 < span <= 1 << 20, span
    page = os.sysconf("SC_PAGE_SIZE")
    first = address["kioskauth_hot_bss_start"] // page * page
    beyond = -(-(address["kioskauth_hot_bss_end"] + 1) // page) * page
    assert reported == f"{(beyond - first) // 1024}KiB", (reported, span)
