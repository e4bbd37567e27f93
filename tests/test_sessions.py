"""Sessions through the real kioskauthd: idle timeout, overnight cut-off, maximum age, lock epoch and
step-up, measured with the daemon's test clock (KIOSKAUTH_TEST_CLOCK_FILE, debug builds only), and
the event stream that tells kiosk apps about them.
"""

import base64
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from idp_testing import (
    SARAH, Connection, IdentityServer, TestClock, audit_events, error_name, have_identity_server, login,
    make_identity_daemon, ok, set_passcode, wait_until,
)
from kioskauth_testing import FAST_HASH_CONFIG, RAW_CLIENT, connect, read_message, send_message

PASSCODE = "482913"


def start(make_daemon, config=""):
    # Only the overnight test keeps the 04:00 cut-off: the others move the clock by hours.
    if "[Session]" not in config:
        config += "\n[Session]\nOvernightCutoff=off\n"
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n" + config)
    clock = TestClock(d.root / "clock.json")
    d.extra_env.update({"KIOSKAUTH_TEST_CLOCK_FILE": str(clock.path), "TZ": "UTC"})
    d.start()
    assert d.ctl("user", "add", "sarah", "--uid", "4242").returncode == 0
    set_passcode(d, "sarah", PASSCODE)
    return d, clock


def authenticated_session(d, conn, name="sarah"):
    """Verifies the passcode on `conn` and opens a session with the ticket."""
    ticket = ok(conn.call("VerifyPasscode", {"name": name, "passcode": PASSCODE}))["ticket"]
    return ok(conn.call("OpenSession", {"name": name, "ticket": ticket, "context": {"service": "kioskauth", "tty": "tty7"}}))["session"]


def sessions(d):
    return ok(d.call("io.kioskauth.ListSessions"))["sessions"]


class Subscriber:
    """A Subscribe call; `next_event` reads the stream."""

    def __init__(self, d):
        self.sock = connect(d.socket, timeout=15)
        send_message(self.sock, {"method": "io.kioskauth.Subscribe", "more": True})
        first = read_message(self.sock)
        assert first["parameters"]["event"]["kind"] == "subscribed", first

    def next_event(self, kind=None):
        while True:
            reply = read_message(self.sock)
            assert reply is not None, "the stream ended"
            event = reply["parameters"]["event"]
            if kind is None or event["kind"] == kind:
                return event

    def close(self):
        self.sock.close()


def test_idle_timeout_ends_the_session_and_activity_postpones_it(make_daemon):
    d, clock = start(make_daemon)
    conn = Connection(d.socket)
    session = authenticated_session(d, conn)
    assert (session["state"], session["name"], session["service"], session["tty"]) == ("active", "sarah", "kioskauth", "tty7")
    assert session.get("overnightCutoff") is None
    events = Subscriber(d)

    # (Margins of a few seconds: real time passes too, between the calls.)
    clock.set(1795)
    assert [s["id"] for s in sessions(d)] == [session["id"]]  # asking is not activity
    ok(conn.call("ReportActivity", {"id": session["id"]}))
    clock.set(1795 + 1795)
    assert [s["state"] for s in sessions(d)] == ["active"]
    clock.set(1795 + 1800)
    # The timekeeping service notices within a second and tells subscribers.
    ended = events.next_event("session-ended")
    assert (ended["session"], ended["name"], ended["reason"]) == (session["id"], "sarah", "idle")
    assert sessions(d) == []
    closed = conn.call("ReportActivity", {"id": session["id"]})
    assert error_name(closed) == "NoSuchSession"
    assert any(e["action"] == "session.end" and e["detail"].endswith("idle") for e in audit_events(d))
    events.close()
    conn.close()


def test_overnight_cutoff_ends_sessions_and_setting_the_clock_back_does_not_postpone_it(make_daemon):
    d, clock = start(make_daemon, "\n[Session]\nIdleTimeoutSec=86400\nMaxAgeSec=0\nOvernightCutoff=04:00\n")
    conn = Connection(d.socket)
    session = authenticated_session(d, conn)
    now = datetime.now(timezone.utc)
    cutoff = now.replace(hour=4, minute=0, second=0, microsecond=0)
    if cutoff <= now:
        cutoff += timedelta(days=1)
    assert session["overnightCutoff"] == cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
    until = (cutoff - now).total_seconds()

    clock.set(until - 5)
    assert [s["state"] for s in sessions(d)] == ["active"]
    # The wall clock is set back an hour while the boot clock runs past the cut-off: still ends.
    clock.set(until - 5 - 3600, until + 1)
    assert sessions(d) == []
    gone = conn.call("StepUp", {"id": session["id"], "maxAgeSeconds": 60})
    assert error_name(gone) == "NoSuchSession"
    reasons = [e["detail"] for e in audit_events(d) if e["action"] == "session.end"]
    assert reasons and reasons[-1].endswith("overnight")
    conn.close()


def test_maximum_age_ends_even_an_active_session(make_daemon):
    d, clock = start(make_daemon, "\n[Session]\nIdleTimeoutSec=86400\nMaxAgeSec=3600\nOvernightCutoff=off\n")
    conn = Connection(d.socket)
    session = authenticated_session(d, conn)
    assert session.get("overnightCutoff") is None
    clock.set(3599)
    ok(conn.call("ReportActivity", {"id": session["id"]}))
    clock.set(3600)
    events = Subscriber(d)
    assert events.next_event("session-ended")["reason"] == "maximumAge"
    conn.close()


def test_step_up_and_the_lock_epoch(make_daemon):
    d, clock = start(make_daemon)
    conn = Connection(d.socket)
    early_ticket = ok(conn.call("VerifyPasscode", {"name": "sarah", "passcode": PASSCODE}))["ticket"]
    session = authenticated_session(d, conn)
    sid = session["id"]

    # A fresh authentication satisfies step-up without a new scan ...
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 60}))["satisfied"] is True
    clock.set(61)
    # ... until it is older than asked.
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 60}))["satisfied"] is False
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 120}))["satisfied"] is True
    ticket = ok(conn.call("VerifyPasscode", {"name": "sarah", "passcode": PASSCODE}))["ticket"]
    ok(conn.call("AuthenticateSession", {"id": sid, "ticket": ticket}))
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 60}))["satisfied"] is True

    # A lock bumps the epoch; nothing from before it counts, however recent.
    events = Subscriber(d)
    locked = ok(conn.call("LockSession", {"id": sid}))["session"]
    assert (locked["state"], locked["lockEpoch"]) == ("locked", 1)
    assert events.next_event()["kind"] == "session-locked"
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 3600}))["satisfied"] is False
    assert error_name(conn.call("GetSessionToken", {"id": sid})) == "SessionLocked"
    # Activity does not unlock it.
    assert ok(conn.call("ReportActivity", {"id": sid}))["session"]["state"] == "locked"
    # The ticket earned before the lock is refused.
    stale = conn.call("AuthenticateSession", {"id": sid, "ticket": early_ticket})
    assert error_name(stale) == "StaleAuthentication"
    # A ticket from another connection is refused too.
    other = Connection(d.socket)
    foreign = ok(other.call("VerifyPasscode", {"name": "sarah", "passcode": PASSCODE}))["ticket"]
    assert error_name(conn.call("AuthenticateSession", {"id": sid, "ticket": foreign})) == "TicketInvalid"
    other.close()
    # A fresh one unlocks.
    fresh = ok(conn.call("VerifyPasscode", {"name": "sarah", "passcode": PASSCODE}))["ticket"]
    unlocked = ok(conn.call("AuthenticateSession", {"id": sid, "ticket": fresh}))["session"]
    assert unlocked["state"] == "active" and unlocked["lockEpoch"] == 1
    assert events.next_event()["kind"] == "session-unlocked"
    assert ok(conn.call("StepUp", {"id": sid, "maxAgeSeconds": 60}))["satisfied"] is True
    # A local person has no identity-provider token.
    assert error_name(conn.call("GetSessionToken", {"id": sid})) == "NoAccessToken"
    events.close()
    conn.close()


def test_session_list_and_security_logout_from_the_cli(make_daemon):
    d, _ = start(make_daemon)
    conn = Connection(d.socket)
    first = authenticated_session(d, conn)
    second = authenticated_session(d, conn)
    listed = d.ctl("session", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("sarah") == 2 and first["id"][:12] in listed.stdout

    # Nobody else may see or touch her sessions.
    assert ok(d.call("io.kioskauth.ListSessions", user="nobody"))["sessions"] == []
    assert error_name(d.call("io.kioskauth.CloseSession", {"id": first["id"]}, user="nobody")) == "NoSuchSession"
    assert error_name(d.call("io.kioskauth.EndSessions", {"name": "sarah"}, user="nobody")) == "PermissionDenied"

    events = Subscriber(d)
    r = d.ctl("session", "end", "sarah")
    assert r.returncode == 0 and r.stdout.strip() == "ended 2 sessions of sarah"
    reasons = {events.next_event("session-ended")["reason"] for _ in range(2)}
    assert reasons == {"securityLogout"}
    assert sessions(d) == []
    assert error_name(conn.call("StepUp", {"id": second["id"], "maxAgeSeconds": 60})) == "NoSuchSession"
    events.close()
    conn.close()


def call_as_uid(d, uid, method, parameters=None):
    """One call from a process running as `uid` (no passwd entry needed)."""
    request = {"method": "io.kioskauth." + method, **({"parameters": parameters} if parameters is not None else {})}
    if method == "Subscribe":
        request["more"] = True
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", sys.executable, str(RAW_CLIENT), d.socket]
    result = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, timeout=30)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_a_person_sees_only_their_own_sessions(make_daemon):
    d, _ = start(make_daemon)  # sarah is bound to uid 4242
    assert d.ctl("user", "add", "omar").returncode == 0
    set_passcode(d, "omar", "517390")
    conn = Connection(d.socket)
    mine = authenticated_session(d, conn)
    ticket = ok(conn.call("VerifyPasscode", {"name": "omar", "passcode": "517390"}))["ticket"]
    theirs = ok(conn.call("OpenSession", {"name": "omar", "ticket": ticket}))["session"]
    (listed,) = call_as_uid(d, 4242, "ListSessions", {})
    assert [s["id"] for s in ok(listed)["sessions"]] == [mine["id"]]
    (step,) = call_as_uid(d, 4242, "StepUp", {"id": mine["id"], "maxAgeSeconds": 600})
    assert ok(step)["satisfied"] is True
    (foreign,) = call_as_uid(d, 4242, "LockSession", {"id": theirs["id"]})
    assert error_name(foreign) == "NoSuchSession"
    # She may end her own sessions (a security logout of herself), not omar's.
    (own,) = call_as_uid(d, 4242, "EndSessions", {"name": "sarah"})
    assert ok(own)["ended"] == 1
    (other,) = call_as_uid(d, 4242, "EndSessions", {"name": "omar"})
    assert error_name(other) == "PermissionDenied"
    assert [s["name"] for s in sessions(d)] == ["omar"]
    conn.close()


def test_sessions_survive_a_daemon_restart_but_not_a_reboot(make_daemon):
    d, clock = start(make_daemon)
    conn = Connection(d.socket)
    session = authenticated_session(d, conn)
    conn.close()
    d.restart()
    assert [s["id"] for s in sessions(d)] == [session["id"]]
    clock.set(0, 0, boot_id="a-later-boot")
    d.restart()
    assert sessions(d) == []
    reasons = [e["detail"] for e in audit_events(d) if e["action"] == "session.end"]
    assert reasons[-1].endswith("rebooted")


def test_removing_a_person_ends_their_sessions(make_daemon):
    d, _ = start(make_daemon)
    conn = Connection(d.socket)
    authenticated_session(d, conn)
    events = Subscriber(d)
    assert d.ctl("user", "remove", "sarah").returncode == 0
    assert events.next_event("session-ended")["reason"] == "personRemoved"
    assert sessions(d) == []
    events.close()
    conn.close()


def test_subscribe_needs_more(daemon):
    reply = daemon.call("io.kioskauth.Subscribe")
    assert reply["error"] == "org.varlink.service.ExpectedMore"


def test_a_subscription_ends_cleanly_when_the_daemon_stops(make_daemon):
    d, _ = start(make_daemon)
    events = Subscriber(d)
    started = time.monotonic()
    assert d.stop() == 0
    assert events.next_event()["kind"] == "shutdown"
    assert time.monotonic() - started < 8  # the subscription does not hold the drain
    events.close()


@pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")
def test_a_kiosk_app_gets_the_current_access_token_of_a_session(make_daemon):
    idp = IdentityServer(access_seconds=4, refresh_seconds=600)
    try:
        d, _ = make_identity_daemon(make_daemon, idp)
        d.start()
        conn = Connection(d.socket)
        signed = ok(login(d, conn=conn))
        sid = ok(conn.call("OpenSession", {"name": signed["person"]["name"], "ticket": signed["ticket"]}))["session"]["id"]
        first = ok(conn.call("GetSessionToken", {"id": sid}))
        claims = json.loads(base64.urlsafe_b64decode(first["accessToken"].split(".")[1] + "=="))
        assert claims["iss"] == idp.issuer
        assert 0 < first["expiresIn"] <= 4
        # Behind the scenes the token is refreshed: a later call returns a newer one.
        later = wait_until(
            lambda: (t := ok(conn.call("GetSessionToken", {"id": sid})))["accessToken"] != first["accessToken"] and t,
            10, message="a refreshed token")
        assert later["expiresAt"] > first["expiresAt"]
        # After a restart nothing is cached: the token is refreshed on demand.
        conn.close()
        d.restart()
        conn = Connection(d.socket)
        # The new connection authenticates the session before it gets the token.
        relogin = ok(login(d, conn=conn))
        ok(conn.call("AuthenticateSession", {"id": sid, "ticket": relogin["ticket"]}))
        again = ok(conn.call("GetSessionToken", {"id": sid}))
        assert again["accessToken"] not in (first["accessToken"], later["accessToken"])
        # Tokens never reach the journal.
        log = d.log_text()
        assert first["accessToken"] not in log and again["accessToken"] not in log
        conn.close()
    finally:
        idp.close()
