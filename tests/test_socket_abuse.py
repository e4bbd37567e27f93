"""Bad input against the live socket: each bad client gets its named error and is disconnected,
and a well-behaved client is served throughout."""

import json
import re
import socket
import threading
import time

import pytest

from idp_testing import wait_until
from kioskauth_testing import FAST_HASH_CONFIG, connect, ensure_group, read_message, send_message


@pytest.fixture
def served(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nIdleTimeoutSec=2\nMaxConnections=64\nMaxConnectionsPerUID=8\n"
                    "[Access]\nRefusalSummaryIntervalSec=1\n").start()
    r = d.ctl("user", "add", "sarah", "--uid", "65534")
    assert r.returncode == 0, r.stderr
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    r = d.ctl("user", "add", "omar")
    assert d.ctl("passcode", "set", "omar", input="593024\n593024\n").returncode == 0
    return d


# For the child processes that hold connections: asks every connection once and waits for its
# first answer, so that a refusal (TooManyConnections, sent as the daemon accepts) is told from an
# accepted connection by what the daemon said, not by how long the child waited for it.
FIRST_ANSWERS = r"""
def first_answers(socks):
    call = json.dumps({"method": "org.varlink.service.GetInfo", "parameters": {}}).encode() + b"\0"
    for s in socks:
        try:
            s.sendall(call)
        except OSError:
            pass  # refused and closed already; the refusal is still there to read
    answers = []
    for s in socks:
        s.settimeout(20)
        data = b""
        while b"\0" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        reply = json.loads(data.split(b"\0")[0]) if data else {"error": "closed without an answer"}
        answers.append(reply.get("error", ""))
    return answers
"""


def tallied(summaries: list[dict]) -> tuple[int, int]:
    """The refused and the rate-limited calls that `access.refused.summary` entries count."""
    refused = limited = 0
    for entry in summaries:
        counted = re.match(r"(\d+) refused calls?(?:, (\d+) rate-limited)? within ", entry["detail"])
        assert counted, entry
        refused += int(counted.group(1))
        limited += int(counted.group(2) or 0)
    return refused, limited


def well_behaved(d):
    reply = d.call("io.kioskauth.GetStatus")
    assert "error" not in reply, reply
    return reply


def assert_closed(s):
    s.settimeout(5)
    try:
        assert s.recv(1) == b""
    except ConnectionResetError:
        pass


def test_malformed_json_gets_named_error_and_disconnect(served):
    s = connect(served.socket)
    s.sendall(b"{this is not json\0")
    reply = read_message(s)
    assert reply["error"] == "io.kioskauth.MalformedMessage"
    assert_closed(s)
    well_behaved(served)


def test_json_that_is_not_a_call_is_malformed(served):
    for payload in (b"[1,2,3]\0", b'{"parameters":{}}\0', b'{"method": 7}\0'):
        s = connect(served.socket)
        s.sendall(payload)
        assert read_message(s)["error"] == "io.kioskauth.MalformedMessage"
        assert_closed(s)
    well_behaved(served)


def test_message_without_nul_beyond_limit_is_refused(served):
    s = connect(served.socket)
    try:
        s.sendall(b'{"method":"io.kioskauth.GetStatus","parameters":{"x":"' + b"a" * (70 * 1024))
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = read_message(s)
    assert reply["error"] == "io.kioskauth.MessageTooLarge"
    assert reply["parameters"]["limit"] == 65536
    assert_closed(s)
    well_behaved(served)


def test_oversized_message_with_nul_is_refused(served):
    s = connect(served.socket)
    big = json.dumps({"method": "io.kioskauth.GetStatus", "parameters": {"pad": "z" * (100 * 1024)}}).encode() + b"\0"
    try:
        s.sendall(big)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert read_message(s)["error"] == "io.kioskauth.MessageTooLarge"
    well_behaved(served)


def test_unknown_method_and_interface_are_named_and_connection_stays_usable(served):
    s = connect(served.socket)
    send_message(s, {"method": "io.kioskauth.NoSuchMethod"})
    reply = read_message(s)
    assert reply == {"error": "org.varlink.service.MethodNotFound", "parameters": {"method": "io.kioskauth.NoSuchMethod"}}
    send_message(s, {"method": "com.example.Other.Thing"})
    assert read_message(s)["error"] == "org.varlink.service.InterfaceNotFound"
    send_message(s, {"method": "io.kioskauth.GetStatus"})
    assert "error" not in read_message(s)


def test_wrong_parameter_types_name_the_parameter(served):
    s = connect(served.socket)
    send_message(s, {"method": "io.kioskauth.GetPerson", "parameters": {"name": 42}})
    assert read_message(s) == {"error": "org.varlink.service.InvalidParameter", "parameters": {"parameter": "name"}}
    send_message(s, {"method": "io.kioskauth.AddPerson", "parameters": {"name": "x", "uid": "root"}})
    assert read_message(s) == {"error": "org.varlink.service.InvalidParameter", "parameters": {"parameter": "uid"}}
    send_message(s, {"method": "io.kioskauth.GetPerson", "parameters": {}})
    assert read_message(s) == {"error": "org.varlink.service.InvalidParameter", "parameters": {"parameter": "name"}}
    send_message(s, {"method": "io.kioskauth.GetPerson", "parameters": "sarah"})
    assert read_message(s)["error"] == "org.varlink.service.InvalidParameter"
    send_message(s, {"method": "io.kioskauth.AddPerson", "parameters": {"name": "Bad Name!"}})
    assert read_message(s)["error"] == "io.kioskauth.InvalidInput"


def test_pipelined_calls_are_answered_in_order(served):
    s = connect(served.socket)
    s.sendall(b"".join(json.dumps({"method": m, "parameters": p}).encode() + b"\0" for m, p in [
        ("io.kioskauth.GetPerson", {"name": "sarah"}),
        ("io.kioskauth.GetPerson", {"name": "ghost"}),
        ("io.kioskauth.GetPerson", {"name": "omar"}),
    ]))
    assert read_message(s)["parameters"]["person"]["name"] == "sarah"
    assert read_message(s)["error"] == "io.kioskauth.NoSuchPerson"
    assert read_message(s)["parameters"]["person"]["name"] == "omar"


def test_pipelined_immediate_and_ordinary_calls_keep_their_order_and_see_earlier_effects(served):
    """GetStatus and the org.varlink.service methods are answered on the event loop, the others
    through the actor: mixed in one pipelined burst, the replies still come in call order, a
    GetStatus after a call sees that call's audit entry, and oneway and bad calls behave."""
    s = connect(served.socket)
    calls = [
        ("io.kioskauth.GetStatus", None, False),
        ("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "111111"}, False),
        ("io.kioskauth.GetStatus", {}, False),
        ("org.varlink.service.GetInfo", None, False),
        ("io.kioskauth.GetStatus", None, True),
        ("io.kioskauth.GetPerson", {"name": "omar"}, False),
        ("io.kioskauth.GetStatus", "seven", False),
        ("org.varlink.service.GetInterfaceDescription", {"interface": "nope"}, False),
        ("io.kioskauth.GetStatus", None, False),
    ]
    frames = []
    for method, parameters, oneway in calls:
        message = {"method": method}
        if parameters is not None:
            message["parameters"] = parameters
        if oneway:
            message["oneway"] = True
        frames.append(json.dumps(message).encode() + b"\0")
    for _ in range(3):
        s.sendall(b"".join(frames))
        first = read_message(s)["parameters"]
        assert read_message(s)["error"] == "io.kioskauth.WrongPasscode"
        after = read_message(s)["parameters"]
        assert after["auditEvents"] == first["auditEvents"] + 1, (first, after)
        assert read_message(s)["parameters"]["vendor"] == "kioskauth"
        assert read_message(s)["parameters"]["person"]["name"] == "omar"
        assert read_message(s)["error"] == "org.varlink.service.InvalidParameter"
        assert read_message(s)["error"] == "org.varlink.service.InterfaceNotFound"
        assert read_message(s)["parameters"]["auditEvents"] == after["auditEvents"]
    assert served.ctl("lockout", "reset", "omar").returncode == 0
    # A person added on another connection shows in the next status.
    people = read_message_after(s, "io.kioskauth.GetStatus")["parameters"]["people"]
    assert served.ctl("user", "add", "lena").returncode == 0
    assert read_message_after(s, "io.kioskauth.GetStatus")["parameters"]["people"] == people + 1
    s.close()


def read_message_after(s, method):
    send_message(s, {"method": method})
    return read_message(s)


def test_silent_client_is_told_idle_timeout_and_disconnected(served):
    s = connect(served.socket)
    started = time.monotonic()
    reply = read_message(s)
    assert reply == {"error": "io.kioskauth.IdleTimeout", "parameters": {"seconds": 2}}
    assert 1.5 < time.monotonic() - started < 10
    assert_closed(s)
    well_behaved(served)


def test_many_connections_from_one_user_hit_the_per_uid_limit_while_others_are_served(served):
    # nobody (uid 65534) opens connections in a child process so the kernel records its uid.
    script = f"""
import socket, json, sys, time
socks = []
for i in range(20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({served.socket!r})
    socks.append(s)
{FIRST_ANSWERS}
print(json.dumps([e for e in first_answers(socks) if e == "io.kioskauth.TooManyConnections"]))
sys.stdout.flush()
time.sleep(3)
"""
    import subprocess
    import sys
    from kioskauth_testing import as_user

    proc = subprocess.Popen(as_user([sys.executable, "-c", script], "nobody"), stdout=subprocess.PIPE, text=True)
    refused = json.loads(proc.stdout.readline())
    assert refused == ["io.kioskauth.TooManyConnections"] * 12
    # While nobody holds 8 connections, root is served at once.
    started = time.monotonic()
    well_behaved(served)
    assert time.monotonic() - started < 10  # not queued behind the flood
    proc.wait(timeout=20)


def test_many_concurrent_clients_are_all_served(served):
    errors = []

    def worker():
        try:
            for _ in range(5):
                reply = served.call("io.kioskauth.GetPerson", {"name": "sarah"})
                if "error" in reply:
                    errors.append(reply)
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_unprivileged_user_cannot_call_admin_methods(served):
    for method, params in [
        ("io.kioskauth.AddPerson", {"name": "mallory"}),
        ("io.kioskauth.ListPeople", {}),
        ("io.kioskauth.RemovePerson", {"name": "omar"}),
        ("io.kioskauth.ResetLockout", {"name": "omar"}),
        ("io.kioskauth.GetAudit", {}),
        ("io.kioskauth.SetPasscode", {"name": "omar", "passcode": "730281", "confirmation": "730281"}),
    ]:
        reply = served.call(method, params, user="nobody")
        assert reply["error"] == "io.kioskauth.PermissionDenied", (method, reply)
    assert served.ctl("user", "show", "omar").returncode == 0
    # An unprivileged caller's refusals are audited as one summary per uid and interval, written
    # when the interval (1 s) ends.
    def refusal_summaries():
        events = json.loads(served.ctl("audit", "--json").stdout)["events"]
        return events, [e for e in events if e["action"] == "access.refused.summary" and e.get("callerUid") == 65534]

    def all_six():
        found = refusal_summaries()
        return found if tallied(found[1])[0] >= 6 else None

    wait_until(all_six, 10, message="the summaries of six refusals")
    time.sleep(1.5)  # one more interval: nothing is counted twice or late
    events, summaries = refusal_summaries()
    # On a loaded machine the six calls may straddle two intervals, so the summaries are added
    # up; every refusal is counted exactly once.
    assert summaries and all(e["result"] == "refused" for e in summaries), summaries
    assert len(summaries) <= 2 and tallied(summaries) == (6, 0), summaries
    assert sum("person.add×1" in e["detail"] for e in summaries) == 1, summaries
    assert not any(e.get("callerUid") == 65534 and e["action"] == "person.add" for e in events)


def test_unprivileged_user_cannot_try_someone_elses_passcode(served):
    reply = served.call("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "593024"}, user="nobody")
    assert reply["error"] == "io.kioskauth.PermissionDenied"
    # It did not count against omar either.
    assert served.call("io.kioskauth.GetPerson", {"name": "omar"})["parameters"]["person"]["passcodeFailures"] == 0
    # nobody may check the passcode of the person bound to their own uid (sarah, uid 65534).
    ok = served.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"}, user="nobody")
    assert ok["parameters"]["person"]["name"] == "sarah"
    assert served.call("io.kioskauth.GetPerson", {"name": "sarah"}, user="nobody")["parameters"]["person"]["uid"] == 65534
    assert served.call("io.kioskauth.GetPerson", {"name": "omar"}, user="nobody")["error"] == "io.kioskauth.PermissionDenied"


def test_group_membership_from_peer_credentials_grants_roles(served):
    ensure_group("kioskauth")
    ensure_group("kioskauth-admin")
    # The groups must exist when the daemon starts: restart it.
    served.restart()
    # A kiosk app in the kioskauth group may authenticate anyone, but not administer.
    ok = served.call("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "593024"}, user="nobody", groups=["kioskauth"])
    assert ok["parameters"]["person"]["name"] == "omar"
    denied = served.call("io.kioskauth.ListPeople", {}, user="nobody", groups=["kioskauth"])
    assert denied["error"] == "io.kioskauth.PermissionDenied"
    # kioskauth-admin may administer.
    listed = served.call("io.kioskauth.ListPeople", {}, user="nobody", groups=["kioskauth-admin"])
    assert {p["name"] for p in listed["parameters"]["people"]} == {"sarah", "omar"}


def test_self_service_passcode_change_needs_a_fresh_ticket_on_the_same_connection(served):
    script = f"""
import json, socket, sys
def call(s, m, p):
    s.sendall(json.dumps({{"method": m, "parameters": p}}).encode() + b"\\0")
    buf = b""
    while b"\\0" not in buf:
        buf += s.recv(65536)
    return json.loads(buf.split(b"\\0")[0])
a = socket.socket(socket.AF_UNIX); a.connect({served.socket!r})
b = socket.socket(socket.AF_UNIX); b.connect({served.socket!r})
out = {{}}
out["without"] = call(a, "io.kioskauth.SetPasscode", {{"name": "sarah", "passcode": "730281", "confirmation": "730281"}})
ticket = call(a, "io.kioskauth.VerifyPasscode", {{"name": "sarah", "passcode": "482913"}})["parameters"]["ticket"]
out["other_connection"] = call(b, "io.kioskauth.SetPasscode", {{"name": "sarah", "passcode": "730281", "confirmation": "730281", "ticket": ticket}})
ticket = call(a, "io.kioskauth.VerifyPasscode", {{"name": "sarah", "passcode": "482913"}})["parameters"]["ticket"]
out["same_connection"] = call(a, "io.kioskauth.SetPasscode", {{"name": "sarah", "passcode": "730281", "confirmation": "730281", "ticket": ticket}})
out["reused"] = call(a, "io.kioskauth.SetPasscode", {{"name": "sarah", "passcode": "840392", "confirmation": "840392", "ticket": ticket}})
print(json.dumps(out))
"""
    import subprocess
    import sys
    from kioskauth_testing import as_user

    out = json.loads(subprocess.run(as_user([sys.executable, "-c", script], "nobody"), capture_output=True, text=True, check=True).stdout)
    assert out["without"]["error"] == "io.kioskauth.TicketInvalid"
    assert out["other_connection"]["error"] == "io.kioskauth.TicketInvalid"
    assert out["same_connection"]["parameters"]["person"]["name"] == "sarah"
    assert out["reused"]["error"] == "io.kioskauth.TicketInvalid"
    assert served.ctl("passcode", "verify", "sarah", input="730281\n").returncode == 0


def test_passcode_context_rules(served):
    ensure_group("kioskauth")
    served.restart()

    def verify(context, name="omar", code="593024"):
        return served.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": code, "context": context})

    assert verify({"service": "kioskauth"})["parameters"]["person"]["name"] == "omar"
    remote = verify({"service": "kioskauth", "remote": True, "remoteHost": "10.0.0.9"})
    assert remote["error"] == "io.kioskauth.PasscodeNotAllowed" and "remote" in remote["parameters"]["reason"]
    other = verify({"service": "cron"})
    assert other["error"] == "io.kioskauth.PasscodeNotAllowed" and "cron" in other["parameters"]["reason"]
    # su/sudo: only the invoking user's own passcode (sarah is bound to uid 65534).
    su_other = verify({"service": "su", "ruid": 65534}, name="omar")
    assert su_other["error"] == "io.kioskauth.PasscodeNotAllowed"
    su_self = verify({"service": "sudo", "ruid": 65534}, name="sarah", code="482913")
    assert su_self["parameters"]["person"]["name"] == "sarah"
    # Refusals never count as failures.
    assert served.call("io.kioskauth.GetPerson", {"name": "omar"})["parameters"]["person"]["passcodeFailures"] == 0


# --- Hogging, flooding and injecting (issue #11) ------------------------------------------------

def _as_uid(uid: int, cmd: list[str], groups: list[int] | None = None) -> list[str]:
    """Runs `cmd` as a numeric uid (it need not exist in passwd) with exactly `groups`."""
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}"]
    prefix += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return prefix + ["--"] + cmd


HOLD_CONNECTIONS = """
import json, socket, sys, time
socks = []
for i in range({count}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({path!r})
    socks.append(s)
{first_answers}
print(first_answers(socks).count("io.kioskauth.TooManyConnections"), flush=True)
sys.stdin.read()  # hold the connections until the test is done
"""


def test_unprivileged_uids_cannot_take_the_connections_reserved_for_root_and_the_groups(make_daemon):
    import subprocess
    import sys

    kiosk_gid = ensure_group("kioskauth")
    admin_gid = ensure_group("kioskauth-admin")
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nIdleTimeoutSec=30\nMaxConnections=64\n"
                    "MaxConnectionsPerUID=8\nReservedConnections=16\n").start()
    # Eight unprivileged uids each take their whole per-uid share: 64 connections, the total.
    holders = [subprocess.Popen(_as_uid(70001 + i, [sys.executable, "-c", HOLD_CONNECTIONS.format(count=8, path=d.socket, first_answers=FIRST_ANSWERS)]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(8)]
    try:
        refused = sum(int(h.stdout.readline()) for h in holders)
        # Root, the greeter's group and the admin group still get in.
        assert "error" not in d.call("io.kioskauth.GetStatus")
        assert "error" not in d.call("io.kioskauth.GetReaders", {}, user="nobody", groups=["kioskauth"])
        assert "error" not in d.call("io.kioskauth.ListPeople", {}, user="nobody", groups=["kioskauth-admin"])
        # Unprivileged callers together get 64 - 16 = 48; the rest are refused, by name.
        assert refused == 16
        # Another unprivileged uid is refused, naming the unprivileged budget.
        reply = d.call("io.kioskauth.GetStatus", user="nobody")
        assert reply == {"error": "io.kioskauth.TooManyConnections", "parameters": {"limit": 48}}
        # Even with privileged connections held open alongside the flood.
        greeter = subprocess.Popen(_as_uid(70100, [sys.executable, "-c", HOLD_CONNECTIONS.format(count=8, path=d.socket, first_answers=FIRST_ANSWERS)],
                                           groups=[kiosk_gid]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        holders.append(greeter)
        assert int(greeter.stdout.readline()) == 0
        assert "error" not in d.call("io.kioskauth.GetStatus", user="nobody", groups=["kioskauth-admin"])
        assert admin_gid
    finally:
        for h in holders:
            h.stdin.close()
            h.wait(timeout=20)
    # Once the flood is gone its slots are free again (as soon as the daemon has seen 64 closes).
    wait_until(lambda: "error" not in d.call("io.kioskauth.GetStatus", user="nobody"), 10,
               message="the flood's connection slots to be free again")


def test_a_client_that_never_reads_its_replies_is_closed_within_the_idle_timeout(make_daemon):
    # The write timeout (10 s by default) is longer: the idle timeout bounds a stalled reply too.
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nIdleTimeoutSec=3\nMaxConnectionsPerUID=2\n").start()
    call = json.dumps({"method": "org.varlink.service.GetInterfaceDescription",
                       "parameters": {"interface": "io.kioskauth"}}).encode() + b"\0"
    # Two connections from nobody, its whole per-uid share, pipelining calls and never reading.
    script = f"""
import socket, sys, threading, time
outcome = {{}}
def flood(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect({d.socket!r})
    s.settimeout(40)
    started = time.monotonic()
    try:
        while True:
            s.sendall({call!r} * 50)
    except (BrokenPipeError, ConnectionResetError) as e:
        outcome[n] = ("closed", time.monotonic() - started)
    except OSError as e:
        outcome[n] = (type(e).__name__, time.monotonic() - started)
threads = [threading.Thread(target=flood, args=(n,)) for n in range(2)]
for t in threads: t.start()
for t in threads: t.join()
for n in range(2): print(*outcome[n], flush=True)
"""
    import subprocess
    import sys
    from kioskauth_testing import as_user

    proc = subprocess.Popen(as_user([sys.executable, "-c", script], "nobody"), stdout=subprocess.PIPE, text=True)
    # While they stall, root is served.
    time.sleep(1)
    well_behaved(d)
    out, _ = proc.communicate(timeout=60)
    results = [line.split() for line in out.splitlines()]
    assert len(results) == 2
    for kind, seconds in results:
        assert kind == "closed", results
        assert float(seconds) < 3 + 5, results
    # Their slots are free again: nobody can connect and be served.
    wait_until(lambda: "error" not in d.call("io.kioskauth.GetStatus", user="nobody"), 10,
               message="the closed connections' slots to be free again")


FLOOD = """
import json, socket, sys, time
calls = [json.dumps({{"method": m, "parameters": p}}).encode() + b"\\0" for m, p in {calls!r}]
socks = []
for _ in range({connections}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(30); s.connect({path!r}); socks.append(s)
while time.time() < {start}:
    time.sleep(0.001)
began = time.monotonic()
for s in socks:
    s.sendall(b"".join(calls))
replies = []
for s in socks:
    buf = b""
    while buf.count(b"\\0") < len(calls):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    replies += [json.loads(m) for m in buf.split(b"\\0")[:-1]]
print(json.dumps({{"elapsed": time.monotonic() - began, "replies": replies}}), flush=True)
"""


def _flood(d, calls, user=None, groups=None, uid=None, processes=4, connections=2):
    import subprocess
    import sys
    from kioskauth_testing import as_user

    start = time.time() + 1.5
    script = FLOOD.format(calls=calls, connections=connections, path=d.socket, start=start)
    cmd = [sys.executable, "-c", script]
    cmd = _as_uid(uid, cmd) if uid is not None else as_user(cmd, user, groups)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    return max(r["elapsed"] for r in results), [reply for r in results for reply in r["replies"]]


def test_a_uids_calls_are_rate_limited_across_concurrent_connections_with_a_named_error(make_daemon):
    ensure_group("kioskauth")
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nRequestsPerSecondPerUID=10\n").start()
    # 4 processes x 2 connections x 10 pipelined calls, all from nobody at the same instant.
    calls = [("org.varlink.service.GetInfo", {})] * 10
    elapsed, replies = _flood(d, calls, user="nobody")
    assert len(replies) == 80
    passed = [r for r in replies if "error" not in r]
    limited = [r for r in replies if r.get("error") == "io.kioskauth.RateLimited"]
    assert len(passed) + len(limited) == 80
    # A full bucket of 10, plus at most what refilled while the burst lasted.
    assert 10 <= len(passed) <= 10 + int(elapsed * 10) + 1, (len(passed), elapsed)
    assert all(r["parameters"]["limit"] == 10 and 0 < r["parameters"]["retryAfter"] <= 0.1 for r in limited)
    # Another uid has its own budget; root and the kiosk-app group are not limited.
    _, other = _flood(d, [("org.varlink.service.GetInfo", {})] * 5, uid=70200, processes=1, connections=1)
    assert all("error" not in r for r in other)
    for who in ({}, {"user": "nobody", "groups": ["kioskauth"]}):
        _, replies = _flood(d, calls, processes=2, **who)
        assert all("error" not in r for r in replies), who
    # The limit refills: a second later nobody is served again.
    time.sleep(1.1)
    assert "error" not in d.call("io.kioskauth.GetStatus", user="nobody")


def test_a_flood_of_refused_calls_is_audited_as_a_bounded_summary(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nRequestsPerSecondPerUID=20\n"
                    "[Access]\nRefusalSummaryIntervalSec=2\n").start()
    assert d.ctl("user", "add", "omar").returncode == 0
    before = len(json.loads(d.ctl("audit", "--json").stdout)["events"])
    calls = [("io.kioskauth.ListPeople", {}), ("io.kioskauth.RemovePerson", {"name": "omar"})] * 50
    elapsed, replies = _flood(d, calls, user="nobody", processes=2, connections=2)
    errors = [r["error"] for r in replies]
    assert len(errors) == 400
    assert 20 <= errors.count("io.kioskauth.PermissionDenied") <= 20 + int(elapsed * 20) + 1, elapsed
    assert set(errors) == {"io.kioskauth.PermissionDenied", "io.kioskauth.RateLimited"}
    # Nothing lost: omar is still there.
    assert d.ctl("user", "show", "omar").returncode == 0

    def all_400():
        events = json.loads(d.ctl("audit", "--json").stdout)["events"][before:]
        found = [e for e in events if e.get("callerUid") == 65534]
        return found if sum(tallied(found)) >= 400 else None

    # The summary is written when the interval that began with the first refusal ends.
    wait_until(all_400, 15, message="the summary of 400 refusals")
    time.sleep(2.5)  # one more interval: nothing is counted twice or late
    found = all_400()
    assert {e["action"] for e in found} == {"access.refused.summary"}, found
    denied = errors.count("io.kioskauth.PermissionDenied")
    assert tallied(found) == (denied, 400 - denied), found
    # Bounded: one entry per 2 s interval the flood spanned (its first and last may be partial).
    assert len(found) <= int(elapsed // 2) + 2, (len(found), elapsed)
    if elapsed < 1.5:  # the whole flood within one 2 s interval: one entry for all of it
        assert len(found) == 1, found
        assert found[0]["detail"].startswith(f"{denied} refused calls, {400 - denied} rate-limited within 2 s: ")
    # The summary is flushed at shutdown too.
    r = d.call("io.kioskauth.ListPeople", {}, user="nobody")
    assert r["error"] == "io.kioskauth.PermissionDenied"
    d.restart()
    events = json.loads(d.ctl("audit", "--json").stdout)["events"]
    last = [e for e in events if e.get("callerUid") == 65534][-1]
    assert last["action"] == "access.refused.summary" and last["detail"].startswith("1 refused call within 2 s")


def test_control_and_bidi_characters_are_refused_at_input_before_anything_is_audited(served):
    before = json.loads(served.ctl("audit", "--json").stdout)["events"]
    reply = served.call("io.kioskauth.VerifyPasscode",
                        {"name": "omar", "passcode": "593024", "context": {"service": "login\u0000evil"}})
    assert reply["error"] == "io.kioskauth.InvalidInput"
    assert reply["parameters"]["field"] == "context.service" and "U+0000" in reply["parameters"]["message"]
    for params, field in [
        ({"name": "mallory", "displayName": "Mal\u001b[2J\u001b]0;pwned\u0007"}, "displayName"),
        ({"name": "mallory", "displayName": "\u202eexe.txt"}, "displayName"),
        ({"name": "mallory", "displayName": "iso\u2066late"}, "displayName"),
        ({"name": "mallory", "displayName": "c1\u009b31m"}, "displayName"),
        ({"name": "mal\u0000lory"}, "name"),
        ({"name": "mallory", "roles": ["caregiver\u001b[31m"]}, "roles"),
    ]:
        reply = served.call("io.kioskauth.AddPerson", params)
        assert reply["error"] == "io.kioskauth.InvalidInput" and reply["parameters"]["field"] == field, (params, reply)
    for context in ({"service": "login", "tty": "tty1\u001b[A"}, {"service": "login", "remoteHost": "h\u202e"}):
        reply = served.call("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "593024", "context": context})
        assert reply["error"] == "io.kioskauth.InvalidInput", reply
    # Nothing was stored, counted or audited with those strings.
    assert served.call("io.kioskauth.GetPerson", {"name": "mallory"})["error"] == "io.kioskauth.NoSuchPerson"
    assert served.call("io.kioskauth.GetPerson", {"name": "omar"})["parameters"]["person"]["passcodeFailures"] == 0
    assert json.loads(served.ctl("audit", "--json").stdout)["events"] == before
    # Ordinary non-ASCII display names are fine.
    reply = served.call("io.kioskauth.AddPerson", {"name": "zoe", "displayName": "Zoë Ødegård"})
    assert reply["parameters"]["person"]["displayName"] == "Zoë Ødegård"


def test_the_cli_escapes_stored_strings_on_output(tmp_path):
    """Strings stored before the input check existed, or that came from the identity provider,
    reach `user list`, `user show` and `audit` escaped. The replies come from a socket that
    answers like a daemon holding such strings."""
    import subprocess
    from kioskauth_testing import KIOSKAUTHCTL

    evil = "Mal\u001b[2J\u001b]0;pwned\u0007\u202eevil\u0000"
    person = {"name": "mallory", "displayName": evil, "roles": ["caregiver"], "primaryRole": "caregiver",
              "origin": "local", "state": "active", "uid": None, "hasPasscode": True, "passcodeHardLocked": False,
              "passcodeFailures": 0, "fingerprintFailures": 0, "fingers": [], "createdAt": "2024-01-01T00:00:00Z"}
    event = {"sequence": 1, "time": "2024-01-01T00:00:00Z", "action": "passcode.verify", "result": "refused",
             "person": "mallory", "callerUid": 0, "callerPid": 1, "service": "login\u001b[31m\u0000evil",
             "detail": "x\u009b2J\u202e", "mac": "00"}
    replies = {"io.kioskauth.ListPeople": {"people": [person]}, "io.kioskauth.GetPerson": {"person": person},
               "io.kioskauth.GetAudit": {"events": [event]}}
    path = str(tmp_path / "sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\0" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                if b"\0" in buf:
                    method = json.loads(buf.split(b"\0")[0])["method"]
                    conn.sendall(json.dumps({"parameters": replies[method]}).encode() + b"\0")

    threading.Thread(target=serve, daemon=True).start()
    try:
        outputs = {}
        for args in (["user", "list"], ["user", "show", "mallory"], ["audit"], ["user", "list", "--json"]):
            r = subprocess.run([str(KIOSKAUTHCTL), *args, "--socket", path], capture_output=True, timeout=20)
            assert r.returncode == 0, r.stderr
            outputs[" ".join(args)] = r.stdout.decode()
    finally:
        server.close()
    for args, out in outputs.items():
        raw = [c for c in out if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F
               or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069]
        assert raw == [], (args, out)
    assert "Mal\\x1B[2J\\x1B]0;pwned\\x07\\u{202E}evil\\x00" in outputs["user list"]
    assert "Mal\\x1B[2J" in outputs["user show mallory"]
    assert "service=login\\x1B[31m\\x00evil" in outputs["audit"] and "x\\x9B2J\\u{202E}" in outputs["audit"]
    # --json stays JSON and decodes to the stored string.
    assert json.loads(outputs["user list --json"])["people"][0]["displayName"] == evil
