"""Bad input against the live socket: each bad client gets its named error and is disconnected,
and a well-behaved client is served throughout."""

import json
import socket
import threading
import time

import pytest

from kioskauth_testing import FAST_HASH_CONFIG, connect, ensure_group, read_message, send_message


@pytest.fixture
def served(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nIdleTimeoutSec=2\nMaxConnections=64\nMaxConnectionsPerUID=8\n").start()
    r = d.ctl("user", "add", "sarah", "--uid", "65534")
    assert r.returncode == 0, r.stderr
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    r = d.ctl("user", "add", "omar")
    assert d.ctl("passcode", "set", "omar", input="593024\n593024\n").returncode == 0
    return d


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
socks, refused = [], []
for i in range(20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({served.socket!r})
    socks.append(s)
time.sleep(0.5)
for s in socks:
    s.setblocking(False)
    try:
        data = s.recv(4096)
        if data:
            refused.append(json.loads(data.split(b"\\0")[0])["error"])
    except BlockingIOError:
        pass
print(json.dumps(refused))
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
    events = json.loads(served.ctl("audit", "--json").stdout)["events"]
    assert any(e["action"] == "person.add" and e["result"] == "refused" and e["callerUid"] == 65534 for e in events)


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
