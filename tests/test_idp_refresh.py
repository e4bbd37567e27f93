"""Background refresh, revocation and the offline window: the real kioskauthd against the real
django-oauth-toolkit server on loopback, with short token lifetimes, and the daemon's test clock
(KIOSKAUTH_TEST_CLOCK_FILE, debug builds only) for the hours-long rules.
"""

import datetime
import json
import sqlite3
import statistics
import threading
import time

import pytest

from fprint_virtual import environment
from kioskauth_testing import read_message, send_message
from idp_testing import (
    SARAH, Connection, IdentityServer, audit_events, enroll_with_ticket, error_name, have_identity_server, login,
    make_identity_daemon, ok, person, scan_call, set_passcode, wait_until,
)

pytestmark = pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")

ACCESS_SECONDS = 4
PASSCODE = "482913"
WINDOW = 8 * 3600
OFFLINE_MESSAGE = "Sign in online: this terminal has been offline for too long."


def contact(d, name=SARAH[0]):
    return person(d, name).get("lastOnlineContactAt")


def verify(d, name=SARAH[0], code=PASSCODE, conn=None):
    if conn is not None:
        return conn.call("VerifyPasscode", {"name": name, "passcode": code})
    return d.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": code})


def signed_in(make_daemon, idp, extra="", passcode=True):
    d, clock = make_identity_daemon(make_daemon, idp, extra)
    d.start()
    name = ok(login(d))["person"]["name"]
    if passcode:
        set_passcode(d, name, PASSCODE)
    return d, clock, name


def wait_for_refresh(d, after, timeout=ACCESS_SECONDS * 3):
    """Waits until the person's last contact is later than `after` (a refresh succeeded)."""
    return wait_until(lambda: (c := contact(d)) and c > after and c, timeout, message="a refresh")


@pytest.fixture
def idp():
    server = IdentityServer(access_seconds=ACCESS_SECONDS, refresh_seconds=600)
    yield server
    server.close()


def test_tokens_are_refreshed_before_they_expire_and_rotated_tokens_replace_old_ones(make_daemon, idp):
    d, _, _ = signed_in(make_daemon, idp, passcode=False)
    first = contact(d)
    # The IdP rotates the refresh token at every use and refuses (and revokes the family of) a
    # rotated-out token: three refreshes in a row only succeed if each rotated token was stored.
    seen = [first]
    for _ in range(3):
        seen.append(wait_for_refresh(d, seen[-1]))
    assert person(d)["state"] == "active" and person(d).get("suspendedReason") is None
    # The first refresh came before the first access token expired, by the IdP's own records:
    # the login's refresh token was rotated out (revoked) less than the access token's lifetime
    # after it was issued. (The test's own clock would add its polling to the daemon's timing.)
    with sqlite3.connect(idp.state_dir / "idp.sqlite3") as db:
        issued, rotated = db.execute(
            "SELECT created, revoked FROM oauth2_provider_refreshtoken ORDER BY id LIMIT 1").fetchone()
    lifetime = datetime.datetime.fromisoformat(rotated) - datetime.datetime.fromisoformat(issued)
    assert datetime.timedelta(0) < lifetime < datetime.timedelta(seconds=ACCESS_SECONDS), (issued, rotated)
    connectivity = ok(d.call("io.kioskauth.GetConnectivity", {"people": True}))
    assert connectivity["state"] == "online" and connectivity["people"][0]["window"] == "open"


def test_a_revoked_token_suspends_local_unlock_until_the_next_online_login(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp)
    ok(verify(d))
    idp.control("revoke-user-tokens", {"email": SARAH[0]})
    wait_until(lambda: person(d).get("suspendedReason"), ACCESS_SECONDS * 3, message="the suspension")
    p = person(d)
    assert (p["state"], p["suspendedReason"]) == ("suspended", "refresh-token-rejected")
    refused = verify(d)
    assert error_name(refused) == "OnlineLoginRequired"
    assert refused["parameters"]["message"].startswith("Sign in online")
    events = [e for e in audit_events(d) if e["action"] == "idp.refresh"]
    assert events and "invalid_grant" in events[-1]["detail"]
    # The CLI says so in one plain line.
    cli = d.ctl("passcode", "verify", name, input=PASSCODE + "\n")
    assert cli.returncode == 1 and cli.stderr.strip().startswith("kioskauthctl: Sign in online")
    # An online login heals it.
    ok(login(d))
    assert person(d)["state"] == "active"
    ok(verify(d))


def test_a_reused_refresh_token_after_a_lost_response_suspends_with_that_reason(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp, passcode=False)
    # The IdP processes the next refresh (rotating the token) but answers only after the daemon's
    # 2 s request timeout: the answer is lost. The daemon retries with the token it holds, which
    # the IdP now sees reused: invalid_grant, and the family is revoked.
    idp.control("fault", {"kind": "stall-after", "seconds": 5, "count": 1})
    wait_until(lambda: person(d).get("suspendedReason"), ACCESS_SECONDS * 4 + 10, message="the suspension")
    assert person(d)["suspendedReason"] == "refresh-token-rejected-after-lost-response"
    details = [e["detail"] for e in audit_events(d) if e["action"] == "idp.refresh"]
    assert any("after a lost response" in detail for detail in details), details
    ok(login(d))
    assert person(d).get("suspendedReason") is None


def test_idp_killed_then_restarted_refreshes_resume_and_unlock_never_stops(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp)
    before = contact(d)
    idp.kill()
    wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["state"] == "offline", ACCESS_SECONDS * 3,
               message="offline")
    ok(verify(d))  # offline, inside the window: unlock works
    assert error_name(login(d)) == "IdentityProviderUnavailable"
    events = []
    subscriber = Subscriber(d)
    idp.start()  # same port, same database: the daemon's refresh token is still valid
    wait_for_refresh(d, before, timeout=20)
    wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["state"] == "online", 10, message="online")
    assert person(d)["state"] == "active"
    assert "online" in subscriber.kinds(wait_for="online", timeout=5)
    subscriber.close()
    ok(verify(d))


class Subscriber:
    """A Subscribe call read on a thread."""

    def __init__(self, d):
        from kioskauth_testing import connect, read_message, send_message
        self.sock = connect(d.socket, timeout=60)
        send_message(self.sock, {"method": "io.kioskauth.Subscribe", "more": True})
        first = read_message(self.sock)
        assert first["parameters"]["event"]["kind"] == "subscribed", first
        self.events = []
        self._read = read_message
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while True:
                reply = self._read(self.sock)
                if reply is None:
                    return
                self.events.append(reply["parameters"]["event"])
                if not reply.get("continues"):
                    return
        except OSError:
            return

    def kinds(self, wait_for=None, timeout=5.0):
        if wait_for:
            wait_until(lambda: any(e["kind"] == wait_for for e in self.events), timeout, message=wait_for)
        return [e["kind"] for e in self.events]

    def close(self):
        self.sock.close()


def median_latency(conn, runs=15):
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        ok(conn.call("VerifyPasscode", {"name": SARAH[0], "passcode": PASSCODE}))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), max(samples)


def test_a_hanging_idp_does_not_slow_down_passcode_unlock(make_daemon):
    # Requests queued at the stopped IdP are processed when it continues, after the daemon gave
    # up on them; a reuse grace period (as Supabase has) keeps that from looking like token
    # reuse. Reuse without grace is test_a_reused_refresh_token_after_a_lost_response_....
    idp = IdentityServer(access_seconds=ACCESS_SECONDS, refresh_seconds=600, extra=("--refresh-grace-seconds", "30"))
    try:
        hanging_idp(make_daemon, idp)
    finally:
        idp.close()


def hanging_idp(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp)
    conn = Connection(d.socket)
    up, _ = median_latency(conn)
    idp.stop()  # SIGSTOP: connections are accepted and never answered
    try:
        # An online login now hangs until the request timeout (2 s) ...
        result = {}
        hanging = threading.Thread(target=lambda: result.setdefault("reply", login(d)))
        hanging.start()
        time.sleep(ACCESS_SECONDS)  # ... and background refreshes are stuck too
        hung, worst = median_latency(conn)
        hanging.join(30)
        assert error_name(result["reply"]) == "IdentityProviderUnavailable"
    finally:
        idp.cont()
    conn.close()
    # Unchanged: the same order as with the IdP up, never anywhere near the 2 s timeout.
    assert hung < up * 2 + 0.05, (up, hung)
    assert worst < 1.0, worst
    # Back online, the background refresh succeeds again.
    stalled = contact(d)
    wait_for_refresh(d, stalled, timeout=20)
    assert person(d)["state"] == "active"


def test_the_offline_window_is_honoured_to_the_second(make_daemon, idp):
    d, clock = make_identity_daemon(make_daemon, idp)
    d.start()
    name = ok(login(d))["person"]["name"]
    logged_in = time.monotonic()  # the contact was recorded just before the reply
    idp.kill()  # no refresh may renew the contact from now on
    set_passcode(d, name, PASSCODE)
    conn = Connection(d.socket)
    ok(verify(d, conn=conn))
    # One second before the window closes (time passes on both clocks): still allowed.
    clock.set(WINDOW - 1 - (time.monotonic() - logged_in) - 0.3)
    ok(verify(d, conn=conn))
    left = ok(d.call("io.kioskauth.GetConnectivity", {"people": True}))["people"][0]
    assert left["window"] == "open" and left["windowSecondsLeft"] <= 1
    # The moment it closes: refused, with the one plain line.
    clock.set(WINDOW - (time.monotonic() - logged_in))
    refused = verify(d, conn=conn)
    assert error_name(refused) == "OfflineWindowExpired", refused
    assert refused["parameters"]["message"] == OFFLINE_MESSAGE
    assert person(d)["passcodeFailures"] == 0  # not counted as a wrong passcode
    assert ok(d.call("io.kioskauth.GetConnectivity", {"people": True}))["people"][0]["window"] == "expired"
    audit = [e for e in audit_events(d) if e["action"] == "passcode.verify" and e["result"] == "refused"]
    assert "offline window ended" in audit[-1]["detail"]
    # A local person on the same terminal has no window.
    assert d.ctl("user", "add", "lina").returncode == 0
    set_passcode(d, "lina", "517390")
    ok(verify(d, "lina", "517390", conn=conn))
    conn.close()


def test_setting_the_wall_clock_back_while_offline_ends_the_window(make_daemon, idp):
    d, clock, name = signed_in(make_daemon, idp)
    idp.kill()
    clock.set(4 * 3600)  # four hours pass
    ok(verify(d))
    # Someone sets the wall clock back by a day (the boot clock cannot be set).
    clock.set(4 * 3600 - 86400, 4 * 3600)
    refused = verify(d)
    assert error_name(refused) == "OfflineWindowExpired"
    backwards = [e for e in audit_events(d) if e["action"] == "clock.backwards"]
    assert len(backwards) == 1 and "every open offline window ended" in backwards[0]["detail"]
    # Catching up again does not reopen it.
    clock.set(4 * 3600 + 10)
    assert error_name(verify(d)) == "OfflineWindowExpired"
    # Nor does a restart with the clock still set back; a reboot (new boot id) neither.
    clock.set(4 * 3600 - 86400, 4 * 3600, boot_id="another-boot")
    d.restart()
    assert error_name(verify(d)) == "OfflineWindowExpired"


def test_after_a_restart_the_schedule_resumes_from_the_store(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp, passcode=False)
    first = contact(d)
    refreshed = wait_for_refresh(d, first)
    d.stop()
    time.sleep(1)
    d.start()
    # The persisted record brings the next refresh back, with the rotated token from the store.
    after = wait_for_refresh(d, refreshed, timeout=ACCESS_SECONDS * 3 + 6)
    wait_for_refresh(d, after, timeout=ACCESS_SECONDS * 3)
    assert person(d)["state"] == "active"


def test_a_refresh_interrupted_by_a_crash_is_retried_as_a_lost_response(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp, passcode=False)
    first = contact(d)
    # The next refresh hangs at the IdP (unprocessed, for longer than this test lasts).
    idp.control("fault", {"kind": "stall-before", "seconds": 60, "count": 1})
    # Wait until the daemon has persisted the refresh as in flight, then kill it.
    def in_flight():
        with sqlite3.connect(d.state / "kioskauth.sqlite") as db:
            (state,) = db.execute("SELECT refresh_state FROM people").fetchone()
        return json.loads(state).get("refreshStartedAt") is not None
    wait_until(in_flight, ACCESS_SECONDS * 2, interval=0.05, message="a refresh in flight")
    d.kill()
    d.start()
    details = [e["detail"] for e in audit_events(d) if e["action"] == "idp.refresh"]
    assert any("in flight when the daemon stopped" in detail for detail in details), details
    wait_for_refresh(d, first, timeout=ACCESS_SECONDS * 3 + 10)
    assert person(d)["state"] == "active"


def test_tokens_that_arrived_as_the_daemon_stops_are_kept(make_daemon, idp):
    # The refresh's answer (with the rotated refresh token) has arrived, but is reported only
    # after the daemon has been told to stop (a debug-build hook holds it until shutdown). It
    # holds the only copy of the new token: dropped, the next start would retry with the spent
    # one, the IdP would see it reused, and she would be suspended until she signs in online.
    d, _ = make_identity_daemon(make_daemon, idp, env={"KIOSKAUTH_TEST_REFRESH_REPORT_DELAY": "120"})
    d.start()
    ok(login(d))
    first = contact(d)

    def rotated_at_the_idp():
        with sqlite3.connect(idp.state_dir / "idp.sqlite3") as db:
            (revoked,) = db.execute("SELECT revoked FROM oauth2_provider_refreshtoken ORDER BY id LIMIT 1").fetchone()
        return revoked is not None
    wait_until(rotated_at_the_idp, ACCESS_SECONDS * 3, interval=0.05, message="the IdP rotating the token")
    assert contact(d) == first  # the answer is still held by the hook
    assert d.stop() == 0
    del d.extra_env["KIOSKAUTH_TEST_REFRESH_REPORT_DELAY"]
    d.start()
    details = [e["detail"] for e in audit_events(d) if e["action"] == "idp.refresh"]
    assert not any("in flight when the daemon stopped" in detail for detail in details), details
    assert contact(d) > first  # the answer was recorded on the way out
    # The rotated token works: the next refreshes succeed and nothing is suspended.
    wait_for_refresh(d, contact(d), timeout=ACCESS_SECONDS * 3 + 10)
    assert person(d)["state"] == "active" and person(d).get("suspendedReason") is None


def test_removing_a_person_revokes_their_refresh_token_at_the_idp(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp, passcode=False)
    idp.kill()  # offline: the revocation waits in the queue, sealed
    assert d.ctl("user", "remove", name).returncode == 0
    assert ok(d.call("io.kioskauth.GetConnectivity"))["outboxPending"] == 1
    idp.start()
    wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["outboxPending"] == 0, 20, message="delivery")
    delivered = [e for e in audit_events(d) if e["action"] == "idp.revoke"]
    assert [e["detail"] for e in delivered][-1] == "queued revocation delivered"
    # The delivered item no longer holds the sealed token ...
    with sqlite3.connect(d.state / "kioskauth.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM outbox WHERE sealed IS NOT NULL").fetchone() == (0,)
    # ... and at the IdP no refresh token of hers is left unrevoked.
    with sqlite3.connect(idp.state_dir / "idp.sqlite3") as db:
        live = db.execute("SELECT COUNT(*) FROM oauth2_provider_refreshtoken WHERE revoked IS NULL").fetchone()[0]
    assert live == 0


def test_a_token_rotated_by_a_superseded_refresh_is_revoked(make_daemon, idp):
    d, _, name = signed_in(make_daemon, idp, passcode=False)
    # The next refresh is processed at once (the token rotates) but answered 1.5 s late ...
    idp.control("fault", {"kind": "stall-after", "seconds": 1.5, "count": 1})

    def in_flight():
        with sqlite3.connect(d.state / "kioskauth.sqlite") as db:
            (state,) = db.execute("SELECT refresh_state FROM people").fetchone()
        return json.loads(state).get("refreshStartedAt") is not None
    wait_until(in_flight, ACCESS_SECONDS * 2, interval=0.02, message="a refresh in flight")
    # ... and meanwhile the person signs in online: a new token family replaces the old one.
    ok(login(d))
    time.sleep(2.5)  # the late answer has arrived by now (and was discarded)
    wait_until(lambda: any(e["action"] == "idp.revoke" for e in audit_events(d)), 15, message="a revocation")
    wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["outboxPending"] == 0, 15, message="delivery")
    # Only the login's token is alive at the IdP; the late answer's rotated token was revoked.
    with sqlite3.connect(idp.state_dir / "idp.sqlite3") as db:
        live = db.execute("SELECT COUNT(*) FROM oauth2_provider_refreshtoken WHERE revoked IS NULL").fetchone()[0]
    assert live == 1
    assert person(d)["state"] == "active"


def test_the_offline_window_gates_fingerprint_unlock_too(make_daemon, idp):
    d, clock = make_identity_daemon(make_daemon, idp, fingerprints=True)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device_storage", sensor, base={}))
    d.start()
    conn = Connection(d.socket)
    signed = ok(login(d, conn=conn))
    name = signed["person"]["name"]
    enrolled = enroll_with_ticket(conn, sensor, name, signed["ticket"], "sarah-right-index")
    assert "error" not in enrolled, enrolled
    idp.kill()
    clock.set(WINDOW - 60)
    assert ok(scan_call(conn, sensor, "Identify", {}, "sarah-right-index"))["person"]["name"] == name
    assert ok(scan_call(conn, sensor, "VerifyFinger", {"name": name}, "sarah-right-index"))["person"]["name"] == name
    clock.set(WINDOW + 1)
    # Verify refuses before asking for a touch; walk-up identify recognises her, then refuses.
    send_message(conn.sock, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": name}, "more": True})
    verify_refused = read_message(conn.sock)
    assert error_name(verify_refused) == "OfflineWindowExpired", verify_refused
    identify_refused = scan_call(conn, sensor, "Identify", {}, "sarah-right-index")
    assert error_name(identify_refused) == "OfflineWindowExpired", identify_refused
    assert identify_refused["parameters"]["message"] == OFFLINE_MESSAGE
    conn.close()
