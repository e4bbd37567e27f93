"""The fleet helper, `kioskauth-fleet` (docs/fleet.md §9.11): the directory's client (postgres-nio,
and with it Foundation and ICU) runs in a process of its own that kioskauthd starts on its first
directory connection and speaks to over a socket pair. These tests attack it from outside: what
the helper can reach of the daemon, what happens when it is killed or the daemon goes, what a
peer that is not kioskauthd can make of it, and a daemon installed without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fleet_support import Client, children, error_name, fleet_test_marks, ok, wait_until
from kioskauth_testing import KIOSKAUTHD, Daemon

pytestmark = fleet_test_marks()

HELPER = KIOSKAUTHD.parent / "kioskauth-fleet"
QUICK = "PollIntervalSec=1\nReconnectMaxSec=1\n"


def add_with_passcode(terminal, name: str) -> None:
    """A person the fleet shares: one with a passcode (a pending one stays on its terminal)."""
    ok(terminal.add_person(name))
    ok(terminal.set_passcode(name, "482913"))


def reaches(a, b, name: str) -> None:
    """A person added with a passcode at terminal A reaches terminal B (within a minute)."""
    add_with_passcode(a, name)
    ok(a.sync())

    def known():
        b.sync()
        return "error" not in b.person(name)

    wait_until(known, timeout=60, interval=0.5, what=f"{b.name} has {name}")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def one_helper(terminal) -> int:
    wait_until(lambda: len(children(terminal.proc.pid)) == 1, timeout=30, what="one fleet helper")
    helpers = children(terminal.proc.pid)
    assert len(helpers) == 1, helpers
    return helpers[0]


def descriptors(pid: int) -> dict[int, str]:
    found = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found[int(fd.name)] = os.readlink(fd)
        except OSError:
            pass  # closed while listing
    return found


# A member terminal ------------------------------------------------------------------------------

def test_a_member_runs_one_helper_that_holds_nothing_of_the_daemon_but_its_socket(make_fleet):
    fleet = make_fleet(["virtual_image"], fleet_config=QUICK)
    a = fleet[0]
    ok(a.sync())
    helper = one_helper(a)
    # Nothing from the daemon's environment: not $CREDENTIALS_DIRECTORY, not $NOTIFY_SOCKET.
    assert Path(f"/proc/{helper}/environ").read_bytes() == b""
    assert "CREDENTIALS_DIRECTORY" in Path(f"/proc/{a.proc.pid}/environ").read_bytes().decode()
    # Its descriptors: the socket pair on standard input, the daemon's log on standard output and
    # error, and what its own event loop and directory connections made. No file of the daemon:
    # not the store, not its key, not the credentials, not the API socket.
    theirs = descriptors(helper)
    assert theirs[0].startswith("socket:"), theirs
    files = sorted(target for target in theirs.values() if target.startswith("/"))
    assert set(files) <= {str(a.log_path)}, files
    daemon_files = {target for target in descriptors(a.proc.pid).values() if target.startswith(str(a.root))}
    assert any(path.endswith(".db") or "kioskauth" in path for path in daemon_files - {str(a.log_path)}), daemon_files
    # Started for this build's wire.
    assert Path(f"/proc/{helper}/cmdline").read_bytes().split(b"\0")[1:3] == [b"--wire", b"1"]
    # Confined with Landlock before it read a request (which sets no_new_privs).
    assert "NoNewPrivs:\t1" in Path(f"/proc/{helper}/status").read_text()


def test_the_confined_helper_can_read_neither_the_store_nor_the_keys_nor_the_daemons_memory(make_fleet):
    """Nor use the daemon's descriptors, signal it, read its limits or reach the journal's
    native socket (a datagram socket)."""
    fleet = make_fleet(["virtual_image"], fleet_config=QUICK)
    a = fleet[0]
    store = a.state / "kioskauth.sqlite"
    targets = [str(store), str(a.credentials / "kioskauth.store-key"), str(a.credentials / "kioskauth.fleet-key"),
               f"/proc/{a.proc.pid}/mem", f"/proc/{a.proc.pid}/fd/0", f"signal:{a.proc.pid}", "signal:0",
               f"limit:{a.proc.pid}", "datagram"]
    # Unconfined, the same user (root here) reaches every one of them.
    for path in targets[:5]:
        with open(path, "rb"):
            pass
    # The helper's own confinement (the function it runs before serving), then the same attempts.
    checked = subprocess.run([str(HELPER), "--sandbox-check", *targets, "/etc/hosts"], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    outcome = dict(line.split("\t") for line in checked.stdout.splitlines())
    for target in targets:
        assert outcome[target].startswith("denied"), (target, outcome[target])
    assert outcome["/etc/hosts"] == "allowed"
    # Its own limits it may read (the seccomp filter lets a process act on itself), and its own
    # threads' /proc stat files, which libdispatch's thread pool reads under load and crashes
    # without (it did: the helper died mid-call on a loaded machine).
    own = subprocess.run([str(HELPER), "--sandbox-check", "limit:0", "threads"], capture_output=True, text=True,
                         timeout=30)
    assert own.stdout.splitlines() == ["limit:0\tallowed", "threads\tallowed"], own
    # And the fleet still works through a confined helper: it resolves, connects and syncs.
    ok(a.sync())
    assert a.status()["reachable"] is True


def test_as_an_unprivileged_user_the_confined_helper_cannot_act_on_that_users_other_processes():
    """In service the helper shares the daemon's user, so no permission check stands between
    them: only the confinement does. Played as nobody against another process of nobody."""
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    target = subprocess.Popen([*as_nobody, "sleep", "120"])
    try:
        pid = target.pid
        wait_until(lambda: "\nUid:\t65534" in Path(f"/proc/{pid}/status").read_text(), timeout=10,
                   what="the target running as nobody")
        # Unconfined, that user may signal it and read (and so set) its limits.
        control = subprocess.run([*as_nobody, "/usr/bin/python3", "-c",
                                  f"import os, resource; os.kill({pid}, 0); resource.prlimit({pid}, resource.RLIMIT_NOFILE)"],
                                 capture_output=True, text=True, timeout=30)
        assert control.returncode == 0, control.stderr
        targets = [f"signal:{pid}", "signal:0", f"limit:{pid}", f"/proc/{pid}/mem", f"/proc/{pid}/fd/0", "datagram"]
        checked = subprocess.run([*as_nobody, str(HELPER), "--sandbox-check", *targets, "limit:0"],
                                 capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        outcome = dict(line.split("\t") for line in checked.stdout.splitlines())
        for target_name in targets:
            assert outcome[target_name].startswith("denied"), (target_name, outcome[target_name])
        assert outcome["limit:0"] == "allowed"
    finally:
        target.kill()
        target.wait()


def test_a_killed_helper_is_started_again_and_the_fleet_syncs_on(make_fleet):
    fleet = make_fleet(["virtual_image", "virtual_image"], fleet_config=QUICK)
    a, b = fleet[0], fleet[1]
    old_a, old_b = one_helper(a), one_helper(b)
    os.kill(old_b, signal.SIGKILL)
    # The daemon waits for it (no zombie left) and says how it ended.
    wait_until(lambda: not Path(f"/proc/{old_b}").exists(), timeout=30, what="the killed helper reaped")
    wait_until(lambda: "fleet helper ended" in b.log_text(), timeout=30, what="the helper's end logged")
    assert "signal 9" in b.log_text()
    # Both daemons still serve, and B's next directory call starts a new helper.
    reaches(a, b, "omar")
    new_b = one_helper(b)
    assert new_b != old_b
    assert one_helper(a) == old_a, "A's helper is untouched"


def sync_in_background(terminal) -> None:
    """A FleetSync on a connection of its own, whose outcome nobody waits for."""

    def run():
        try:
            client = Client(terminal.socket)
            try:
                client.call("FleetSync")
            finally:
                client.close()
        except OSError:
            pass  # the daemon stopped under it

    threading.Thread(target=run, daemon=True).start()


def test_a_hung_helper_is_replaced_and_does_not_hold_up_the_daemons_stop(make_fleet, monkeypatch):
    # A request unanswered for 10 s (debug-build hook; the default is twice the operation
    # timeout) means the helper stopped serving.
    monkeypatch.setenv("KIOSKAUTH_TEST_FLEET_HELPER_DEADLINE", "10")
    fleet = make_fleet(["virtual_image", "virtual_image"], fleet_config=QUICK)
    a, b = fleet[0], fleet[1]
    stuck = one_helper(b)
    os.kill(stuck, signal.SIGSTOP)
    try:
        # B's next directory call waits on it; at the deadline the helper is killed and reaped.
        sync_in_background(b)
        wait_until(lambda: "fleet helper did not answer" in b.log_text(), timeout=60, what="the hang noticed")
        wait_until(lambda: not Path(f"/proc/{stuck}").exists(), timeout=30, what="the hung helper killed")
        # A new helper serves B, and the fleet syncs on.
        reaches(a, b, "omar")
        # Hung again, with a call waiting on it: the daemon's stop neither waits for that call
        # nor leaves the helper behind.
        stuck = one_helper(b)
        os.kill(stuck, signal.SIGSTOP)
        sync_in_background(b)
        time.sleep(0.5)
        started = time.monotonic()
        assert b.stop() == 0
        assert time.monotonic() - started < 8  # its call deadline (10 s) never came into it
        assert not alive(stuck)
    finally:
        if alive(stuck):
            os.kill(stuck, signal.SIGKILL)


def test_concurrent_callers_share_one_helper_and_every_call_is_answered(make_fleet):
    fleet = make_fleet(["virtual_image", "virtual_image"], fleet_config=QUICK)
    a, b = fleet[0], fleet[1]
    helper = one_helper(b)
    failures: list[str] = []
    replies: list[dict] = []
    lock = threading.Lock()

    def caller(index: int) -> None:
        from fleet_support import Client

        client = Client(b.socket)
        try:
            for round in range(8):
                method = ("FleetStatus", "FleetSync", "FleetTerminals")[(index + round) % 3]
                reply = client.call(method)
                with lock:
                    replies.append(reply)
                    if "error" in reply:
                        failures.append(f"{method}: {reply}")
        finally:
            client.close()

    writer = threading.Thread(target=lambda: [add_with_passcode(a, f"p{i}") for i in range(10)])
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)] + [writer]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert failures == [], failures[:5]
    assert len(replies) == 64
    assert children(b.proc.pid) == [helper]

    def knows_all():
        ok(b.sync())
        return all("error" not in b.person(f"p{i}") for i in range(10))

    wait_until(knows_all, timeout=60, interval=0.5, what="B has all ten")


def test_the_helper_goes_with_the_daemon_whether_it_stops_or_is_killed(make_fleet):
    fleet = make_fleet(["virtual_image", "virtual_image"], fleet_config=QUICK)
    a, b = fleet[0], fleet[1]
    helper_a, helper_b = one_helper(a), one_helper(b)
    assert a.stop() == 0
    # Stopped: the daemon has waited for its helper before it exited.
    assert not alive(helper_a)
    b.kill()
    # Killed: the kernel closed the daemon's end of the socket, and the helper exits by itself.
    wait_until(lambda: not alive(helper_b), timeout=20, what="B's helper gone")


# The helper from outside ------------------------------------------------------------------------

def test_the_helper_refuses_to_run_by_hand_or_for_another_build():
    by_hand = subprocess.run([str(HELPER), "--wire", "1"], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=30)
    assert by_hand.returncode == 64, by_hand
    assert "not a socket" in by_hand.stderr
    ours, theirs = socket.socketpair()
    with ours, theirs:
        for wire in (["--wire", "0"], []):
            other = subprocess.run([str(HELPER), *wire], stdin=theirs, capture_output=True, text=True, timeout=30)
            assert other.returncode == 64, other
            assert "wire version" in other.stderr


class Peer:
    """A peer speaking the helper's wire (4-byte length, JSON) over a socket pair."""

    def __init__(self):
        self.ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([str(HELPER), "--wire", "1", "--log-level", "debug"], stdin=theirs,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        theirs.close()
        self.ours.settimeout(30)

    def send_raw(self, data: bytes) -> None:
        self.ours.sendall(data)

    def send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        self.send_raw(struct.pack(">I", len(body)) + body)

    def receive(self) -> dict | None:
        """The next message that is not a log line; None at the end of the stream."""
        while True:
            header = self._exactly(4)
            if header is None:
                return None
            body = self._exactly(struct.unpack(">I", header)[0])
            message = json.loads(body)
            if "log" not in message:
                return message

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.ours.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> int:
        self.ours.close()
        return self.process.wait(timeout=30)


def failure(message: dict) -> tuple[str, dict]:
    """(kind, its values) of a failed answer."""
    error = message["answer"]["reply"]["failed"]["_0"]
    (kind, values), = error["kind"].items()
    return kind, values


def test_a_peer_gets_named_errors_for_calls_it_may_not_make():
    peer = Peer()
    try:
        # An operation on a connection it never made: nothing is sent anywhere.
        peer.send({"id": 1, "connection": 5, "call": {"pull": {"after": 0, "limit": 10}}})
        answer = peer.receive()
        assert answer["answer"]["id"] == 1 and answer["answer"]["sent"] is False
        assert failure(answer)[0] == "connectionClosed"
        # Connecting where nobody listens: the directory is unavailable, and says why.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        endpoint = {"transport": {"tcp": {"host": "127.0.0.1", "port": port}}, "security": {"plaintext": {}},
                    "username": "kiosk", "database": "fleet"}
        peer.send({"id": 2, "connection": 1, "call": {"connect": {"endpoint": endpoint, "password": "x"}}})
        answer = peer.receive()
        kind, values = failure(answer)
        assert answer["answer"]["id"] == 2 and kind == "directoryUnavailable", answer
        # It still serves after both.
        peer.send({"id": 3, "connection": 1, "call": {"close": {}}})
        assert peer.receive()["answer"]["reply"] == {"done": {}}
    finally:
        assert peer.close() == 0


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x05hello",                      # a body that is not JSON
    b"\x00\x00\x00\x02{}",                         # JSON that is not a request
    struct.pack(">I", 256 * 1024 * 1024 + 1),      # a length larger than any message
])
def test_a_peer_that_sends_garbage_is_cut_off_and_the_helper_exits(garbage):
    peer = Peer()
    peer.send_raw(garbage)
    # It ends the conversation (no answer to misread) and exits on its own.
    assert peer.receive() is None
    assert peer.process.wait(timeout=30) == 0
    peer.close()


# Installed without the helper -------------------------------------------------------------------

class LoneDaemon(Daemon):
    """kioskauthd copied into a directory of its own, with no kioskauth-fleet beside it."""

    def __init__(self, binary: Path, **kwargs):
        super().__init__(**kwargs)
        self.binary = binary

    def command(self) -> list[str]:
        return [str(self.binary), *super().command()[1:]]


def test_a_daemon_without_its_helper_says_so_and_serves_on(tmp_path):
    lone = tmp_path / "sbin" / "kioskauthd"
    lone.parent.mkdir()
    shutil.copy2(KIOSKAUTHD, lone)
    directory = "postgres://kiosk@127.0.0.1:1/fleet?sslmode=disable"
    for binary, expected in ((lone, "kioskauth-fleet is not installed"), (KIOSKAUTHD, "Connection refused")):
        d = LoneDaemon(binary).start()
        try:
            reply = d.call("io.kioskauth.FleetMigrate", {"directory": directory, "password": "x"})
            assert error_name(reply) == "FleetUnreachable", reply
            assert expected.lower() in json.dumps(reply).lower(), reply
            assert "error" not in d.call("io.kioskauth.GetStatus")
            # No connection is left open, so no helper is kept (the daemon stops an idle one).
            wait_until(lambda: children(d.proc.pid, zombies=True) == [], timeout=40, what="no helper left")
        finally:
            d.close()


# A helper that is not ours ----------------------------------------------------------------------
# The helper runs a network-facing client; the daemon must survive one that was subverted. A fake
# kioskauth-fleet (a script speaking the wire) beside a copy of kioskauthd plays it.

FAKE_HELPER = r"""#!/usr/bin/python3
import json, socket, struct, sys, time
MODE = "@MODE@"
peer = socket.socket(fileno=0)


def send(message):
    body = json.dumps(message).encode()
    peer.sendall(struct.pack(">I", len(body)) + body)


def exactly(n):
    data = b""
    while len(data) < n:
        chunk = peer.recv(n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def fail(request, reason):
    kind = {"directoryUnavailable": {"_0": reason}}
    send({"answer": {"id": request["id"], "reply": {"failed": {"_0": {"kind": kind, "file": "fake", "line": 1}}},
                     "sent": False}})


while True:
    request = json.loads(exactly(struct.unpack(">I", exactly(4))[0]))
    if MODE == "forge":
        send({"log": {"level": "critical", "message": "forged entry", "source": "kioskauthd", "metadata": {
            "MESSAGE_ID": "cc3b94b5b96042b1b319637a8f69986a", "KIOSKAUTH_ACTION": "daemon.start",
            "KIOSKAUTH_RESULT": "success", "x" * 500: "y" * 5000}}})
        fail(request, "fake directory")
    elif MODE == "flood":
        line = json.dumps({"log": {"level": "info", "message": "flood", "source": "x", "metadata": {}}}).encode()
        frame = struct.pack(">I", len(line)) + line
        try:
            for _ in range(20):
                peer.sendall(frame * 10000)
        except OSError:
            sys.exit(0)
        time.sleep(60)
    elif MODE == "bulk":
        line = json.dumps({"log": {"level": "info", "message": "b" * (60 << 20), "source": "x",
                                   "metadata": {}}}).encode()
        try:
            for _ in range(6):
                peer.sendall(struct.pack(">I", len(line)) + line)
        except OSError:
            sys.exit(0)
        fail(request, "fake directory")
        time.sleep(60)
    elif MODE == "oversize":
        peer.sendall(struct.pack(">I", (64 << 20) + 1))
        time.sleep(60)
    elif MODE == "silent":
        time.sleep(3600)
"""


@pytest.fixture(scope="module")
def lone_bin(tmp_path_factory) -> Path:
    """A directory with a copy of kioskauthd and room for a kioskauth-fleet beside it."""
    directory = tmp_path_factory.mktemp("lone") / "sbin"
    directory.mkdir()
    shutil.copy2(KIOSKAUTHD, directory / "kioskauthd")
    return directory


def with_fake_helper(lone_bin: Path, mode: str, **kwargs) -> LoneDaemon:
    fake = lone_bin / "kioskauth-fleet"
    fake.write_text(FAKE_HELPER.replace("@MODE@", mode))
    fake.chmod(0o755)
    return LoneDaemon(lone_bin / "kioskauthd", **kwargs)


MIGRATE = ("io.kioskauth.FleetMigrate", {"directory": "postgres://kiosk@127.0.0.1:1/fleet?sslmode=disable",
                                         "password": "x"})


def test_a_subverted_helper_cannot_write_the_daemons_journal_fields(lone_bin):
    d = with_fake_helper(lone_bin, "forge").start()
    try:
        assert error_name(d.call(*MIGRATE)) == "FleetUnreachable"
        wait_until(lambda: "forged entry" in d.log_text(), timeout=10, what="the helper's line logged")
        line = next(line for line in d.log_text().splitlines() if "forged entry" in line)
        # Logged as the helper's, under keys of its own: never MESSAGE_ID or KIOSKAUTH_* fields.
        assert "fleet helper: forged entry" in line, line
        assert "helper_MESSAGE_ID=cc3b94b5b96042b1b319637a8f69986a" in line, line
        assert " MESSAGE_ID=" not in line and " KIOSKAUTH_ACTION=" not in line, line
        # Long keys and values are cut.
        assert "x" * 49 not in line and "y" * 1025 not in line, len(line)
    finally:
        d.close()


def test_a_helper_that_floods_the_daemon_is_cut_off_and_the_daemon_serves_on(lone_bin):
    d = with_fake_helper(lone_bin, "flood").start()
    try:
        before = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{d.proc.pid}/status").read_text()).group(1))
        reply = d.call(*MIGRATE)
        assert error_name(reply) == "FleetUnreachable", reply
        # Cut off once it is 4096 messages ahead (a wake-up or a log line each), and said so.
        wait_until(lambda: "ahead of the daemon" in d.log_text(), timeout=60,
                   what="the flooding helper cut off")
        wait_until(lambda: children(d.proc.pid, zombies=True) == [], timeout=30, what="the flooding helper gone")
        assert "error" not in d.call("io.kioskauth.GetStatus")
        flooded = d.log_text().count("fleet helper: flood")
        assert flooded < 200_000, flooded
        after = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{d.proc.pid}/status").read_text()).group(1))
        assert after - before < 64 * 1024, (before, after)
    finally:
        d.close()


def peak_rss_kib(pid: int) -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


@pytest.mark.parametrize("mode", ["bulk", "oversize"])
def test_a_helper_sending_huge_messages_costs_the_daemon_a_bounded_peak(lone_bin, mode):
    d = with_fake_helper(lone_bin, mode).start()
    try:
        before = peak_rss_kib(d.proc.pid)
        reply = d.call(*MIGRATE)
        assert error_name(reply) == "FleetUnreachable", reply
        wait_until(lambda: children(d.proc.pid, zombies=True) == [], timeout=60, what="the helper gone")
        assert "error" not in d.call("io.kioskauth.GetStatus")
        grown = peak_rss_kib(d.proc.pid) - before
        print(f"{mode}: peak RSS grew by {grown // 1024} MiB")
        # Six 60 MiB messages sent as fast as the socket takes them: at most one queued, one
        # being read, and one decoded (its bytes copied once, its text once) at a time, so about
        # four largest frames (64 MiB each) at the peak; without the bounds, all six and more.
        assert grown < 5 * 64 * 1024, grown
    finally:
        d.close()


def test_a_helper_that_never_answers_is_stopped_and_the_call_fails(lone_bin):
    d = with_fake_helper(lone_bin, "silent", env={"KIOSKAUTH_TEST_FLEET_HELPER_DEADLINE": "2"}).start()
    try:
        started = time.monotonic()
        reply = d.call(*MIGRATE)
        assert error_name(reply) == "FleetUnreachable", reply
        assert time.monotonic() - started < 30
        assert "fleet helper did not answer" in d.log_text()
        wait_until(lambda: children(d.proc.pid, name="python3", zombies=True) == [] and
                   children(d.proc.pid, zombies=True) == [], timeout=30, what="the silent helper gone")
        assert "error" not in d.call("io.kioskauth.GetStatus")
    finally:
        d.close()


# A helper that stands between the daemon and the real one: it relays every frame, except that
# it answers the first useKeyring after @MARK@ appears with a failure (and removes the mark), as a
# helper that lost its directory connection at that moment would.
RELAY_HELPER = r"""#!/usr/bin/python3
import json, os, socket, struct, subprocess, sys, threading
daemon = socket.socket(fileno=0)
ours, theirs = socket.socketpair()
real = subprocess.Popen(["@REAL@", *sys.argv[1:]], stdin=theirs, close_fds=True, env={})
theirs.close()
to_daemon = threading.Lock()


def exactly(peer, n):
    data = b""
    while len(data) < n:
        chunk = peer.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def frames(peer):
    while (head := exactly(peer, 4)) is not None:
        body = exactly(peer, struct.unpack(">I", head)[0])
        if body is None:
            return
        yield head + body


def answer_daemon(frame):
    with to_daemon:
        daemon.sendall(frame)


def from_real():
    for frame in frames(ours):
        answer_daemon(frame)
    os._exit(0)


threading.Thread(target=from_real, daemon=True).start()
for frame in frames(daemon):
    request = json.loads(frame[4:])
    if "useKeyring" in request.get("call", {}) and os.path.exists("@MARK@"):
        os.unlink("@MARK@")
        kind = {"directoryUnavailable": {"_0": "the relay refused the keyring"}}
        body = json.dumps({"answer": {"id": request["id"], "sent": True,
                                      "reply": {"failed": {"_0": {"kind": kind, "file": "relay", "line": 1}}}}})
        answer_daemon(struct.pack(">I", len(body)) + body.encode())
        continue
    ours.sendall(frame)
ours.shutdown(socket.SHUT_RDWR)  # the real helper sees the end (a bare close would wait on the reader)
real.wait()
"""


def test_a_connection_that_did_not_take_the_keyring_is_replaced_and_no_change_is_lost(make_fleet, tmp_path):
    fleet = make_fleet(["virtual_image", "virtual_image"], fleet_config=QUICK)
    a, b = fleet[0], fleet[1]
    # B is restarted from a copy of kioskauthd whose kioskauth-fleet is the relay.
    bin_dir = tmp_path / "sbin"
    bin_dir.mkdir()
    shutil.copy2(KIOSKAUTHD, bin_dir / "kioskauthd")
    mark = tmp_path / "refuse-the-keyring"
    relay = bin_dir / "kioskauth-fleet"
    relay.write_text(RELAY_HELPER.replace("@REAL@", str(HELPER)).replace("@MARK@", str(mark)))
    relay.chmod(0o755)
    b.stop()
    standard = b.command
    b.command = lambda: [str(bin_dir / "kioskauthd"), *standard()[1:]]
    mark.write_text("")
    b.start()
    # Restarted, B reads its keys from the store and hands them to the connection it has.
    wait_until(lambda: not mark.exists(), timeout=60, interval=0.3, what="the keyring refused once")
    # A person added at A after that: B must get them. A connection left open without the keyring
    # would pull their rows as unverifiable, refuse them and move B's cursor past them for good.
    reaches(a, b, "omar")
    log = b.log_text()
    assert log.count("did not take the keyring: reconnecting") == 1, log[-3000:]
    # Now a new connection while B holds its keys (its helper gone): the keyring goes with the
    # connection, is refused once, and B connects again.
    mark.write_text("")
    relays = children(b.proc.pid, name=relay.name)
    assert relays, "B runs its relay"
    for relay_pid in relays:
        os.kill(relay_pid, signal.SIGKILL)
    reaches(a, b, "nadia")
    assert not mark.exists()
    log = b.log_text()
    assert log.count("did not take the keyring: reconnecting") == 2, log[-3000:]
    assert "fleet rows refused" not in log, log[-3000:]
    assert b.status()["rejectedChanges"] == 0, b.status()
