"""Limiters hold under concurrency (issue #11, item 7): every attempt takes its slot before the
daemon awaits the identity provider or Argon2, so N concurrent attempts against a limit of M check
exactly M. And no name enumeration (item 11): callers who may act only on themselves get one
answer for somebody else and for nobody. Real processes of other uids make the calls."""

import threading

import pytest

from idp_testing import (
    SARAH, Connection, IdentityServer, TestClock, audit_events, error_name, have_identity_server,
    make_identity_daemon,
)
from kioskauth_testing import FAST_HASH_CONFIG


def concurrently(n, connect, call):
    """Fires `call` from n threads at once, each on its own connection; returns the error names."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i):
        conn = connect()
        barrier.wait()
        results[i] = error_name(call(conn)) or "ok"
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")
def test_concurrent_wrong_passwords_reach_the_provider_exactly_login_max_failures_times(make_daemon):
    idp = IdentityServer()
    try:
        d, _ = make_identity_daemon(make_daemon, idp, "LoginMaxFailures=10\nLoginFailureWindowSec=600\n")
        d.start()
        results = concurrently(15, lambda: Connection(d.socket), lambda c: c.call("LoginWithPassword", {"email": SARAH[0], "password": "guess"}))
        assert sorted(results) == ["OnlineLoginPaused"] * 5 + ["WrongCredentials"] * 10, results
        rows = [e for e in audit_events(d) if e["action"] == "idp.login"]
        assert len([e for e in rows if e["result"] == "failure"]) == 10
        assert len([e for e in rows if e["result"] == "refused"]) == 5
    finally:
        idp.close()


def test_concurrent_wrong_passcodes_check_exactly_the_configured_number(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n[Passcode]\nLockoutDelaysSec=0\nHardLockAfter=4\n")
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    results = concurrently(12, lambda: Connection(d.socket), lambda c: c.call("VerifyPasscode", {"name": "sarah", "passcode": "111111"}))
    assert sorted(results) == ["PasscodeLocked"] * 9 + ["WrongPasscode"] * 3, results
    checked = [e for e in audit_events(d) if e["action"] == "passcode.verify" and e["result"] == "failure"]
    assert len(checked) == 4  # the 4th was checked and hard-locked


def test_unprivileged_callers_get_one_answer_for_somebody_and_nobody(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n")
    d.start()
    assert d.ctl("user", "add", "sarah", "--uid", "4242").returncode == 0
    calls = [
        ("VerifyPasscode", lambda n: {"name": n, "passcode": "111111"}),
        ("OpenSession", lambda n: {"name": n}),
        ("CheckAccount", lambda n: {"name": n}),
        ("ListFingers", lambda n: {"name": n}),
        ("EndSessions", lambda n: {"name": n}),
        ("SetPasscode", lambda n: {"name": n, "passcode": "593024", "confirmation": "593024"}),
        ("GetPerson", lambda n: {"name": n}),
    ]
    for method, params in calls:
        existing = d.call("io.kioskauth." + method, params("sarah"), user="nobody")
        unknown = d.call("io.kioskauth." + method, params("nosuchperson"), user="nobody")
        assert error_name(existing) == error_name(unknown) == "PermissionDenied", (method, existing, unknown)
        assert existing["parameters"] == unknown["parameters"], method
    # Admins still learn that a name is unknown.
    assert error_name(d.call("io.kioskauth.ListFingers", {"name": "nosuchperson"})) == "NoSuchPerson"


def test_moving_the_wall_clock_skips_no_lockout_delay_and_setting_it_back_extends_none(make_daemon):
    """Issue #11 item 14: delays run on the boot clock (the daemon's test clock moves each)."""
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n[Passcode]\nLockoutDelaysSec=0 0 60\n")
    clock = TestClock(d.root / "clock.json")
    d.extra_env.update({"KIOSKAUTH_TEST_CLOCK_FILE": str(clock.path), "TZ": "UTC"})
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    for _ in range(3):
        assert error_name(d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "111111"})) == "WrongPasscode"
    # The wall clock a day ahead, the boot clock unmoved: the 60 s delay still holds.
    clock.set(86400, 0)
    held = d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
    assert error_name(held) == "PasscodeLocked" and 50 <= held["parameters"]["retryAfterSeconds"] <= 60, held
    # The wall clock a day behind, the boot clock 61 s on: the delay is over.
    clock.set(-86400, 61)
    assert "error" not in d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})


def test_concurrent_wrong_activation_codes_check_exactly_the_terminal_limit(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n[Activation]\nTerminalMaxFailures=5\n")
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    results = concurrently(12, lambda: Connection(d.socket), lambda c: c.call("CheckActivationCode", {"code": "7KQ2-M9XD"}))
    assert sorted(results) == ["ActivationCodeWrong"] * 5 + ["ActivationPaused"] * 7, results
    checked = [e for e in audit_events(d) if e["action"] == "activation.check" and e["result"] == "failure"]
    assert len(checked) == 5


def test_a_passcode_storm_beyond_the_hashing_queue_is_refused_busy_and_not_counted(make_daemon):
    """Argon2id runs on a bounded pool: with one worker and no queue, of 8 concurrent passcodes
    one is checked and the rest are refused at once with Busy, before they count as attempts."""
    d = make_daemon(config="[Store]\nPasscodeHashMemoryKiB=65536\nPasscodeHashIterations=3\n"
                    "PasscodeHashWorkers=1\nPasscodeHashQueue=0\n[Passcode]\nLockoutDelaysSec=0\n"
                    "[Fingerprint]\nEnabled=no\n")
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    results = concurrently(8, lambda: Connection(d.socket),
                           lambda c: c.call("VerifyPasscode", {"name": "sarah", "passcode": "111111"}))
    checked = results.count("WrongPasscode")
    assert checked >= 1 and results.count("Busy") >= 1, results
    assert checked + results.count("Busy") == 8, results
    person = d.call("io.kioskauth.GetPerson", {"name": "sarah"})["parameters"]["person"]
    assert person["passcodeFailures"] == checked, (person, results)
    # A Busy reply leaves the connection usable, and the pool free again takes the next call.
    assert "error" not in d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})


# One storm client: VerifyPasscode as fast as answered on one connection for `seconds`, printing
# the monotonic time of each answer (CLOCK_MONOTONIC is the same clock in every process).
STORM_CLIENT = r"""
import json, socket, sys, time
path, name, passcode, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
call = json.dumps({"method": "io.kioskauth.VerifyPasscode",
                   "parameters": {"name": name, "passcode": passcode}}).encode() + b"\0"
end = time.monotonic() + seconds
buf = b""
while time.monotonic() < end:
    s.sendall(call)
    while b"\0" not in buf:
        buf += s.recv(65536)
    reply, buf = buf.split(b"\0", 1)
    print(time.monotonic(), json.loads(reply).get("error", "ok"), flush=True)
"""


def test_a_passcode_storm_from_another_uid_cannot_starve_a_legitimate_unlock(make_daemon):
    """A kiosk app (the authenticator group, another uid) storms VerifyPasscode over six
    connections while root (as PAM is) unlocks. With one hashing worker, a first-come queue puts
    the unlock behind every storm hash already waiting (five or six); the pool serves the uids in
    turn, so at most the storm hash running and one more finish while the unlock waits. The
    storm's passcodes are right ones, so no lockout stops it hashing.

    The answers are timed by the storm clients as they read them, so a client scheduled late
    makes a hash that finished just before an unlock was sent look as if it overtook it. Each
    hash costs about a tenth of a second (64 MiB, 3 passes), so that slack is small against
    one hash even on a loaded machine, and one such answer is allowed for."""
    import subprocess
    import sys
    import time

    from kioskauth_testing import as_user, ensure_group
    from test_core_e2e import add, set_passcode

    ensure_group("kioskauth")  # the storm runs in it; not left to another test to have made it
    d = make_daemon(config="[Store]\nPasscodeHashWorkers=1\nPasscodeHashMemoryKiB=65536\nPasscodeHashIterations=3\n")
    d.start()
    clients = 6
    for name in ["sarah"] + [f"storm{i}" for i in range(clients)]:
        add(d, name)
        assert set_passcode(d, name, "482913").returncode == 0
    seconds = 12
    storm = [subprocess.Popen(as_user([sys.executable, "-c", STORM_CLIENT, d.socket, f"storm{i}", "482913", str(seconds)],
                                      "nobody", ["kioskauth"]), stdout=subprocess.PIPE, text=True)
             for i in range(clients)]
    try:
        time.sleep(2)  # the storm fills the queue
        unlocks = []
        conn = Connection(d.socket)
        for _ in range(4):
            sent = time.monotonic()
            reply = conn.call("VerifyPasscode", {"name": "sarah", "passcode": "482913"})
            unlocks.append((sent, time.monotonic()))
            assert "error" not in reply, reply
        conn.close()
    finally:
        outputs = [p.communicate(timeout=seconds + 30)[0] for p in storm]
    answers = [line.split() for out in outputs for line in out.splitlines() if line.strip()]
    assert answers and all(result == "ok" for _, result in answers), answers[:5]
    times = [float(t) for t, _ in answers]
    # Storm hashes that finished while each unlock waited: the one running and one more at most,
    # plus one for a storm answer read late (see above). A first-come queue shows five or six.
    overtaken = [sum(1 for t in times if sent < t < done) for sent, done in unlocks]
    assert max(overtaken) <= 3, overtaken
