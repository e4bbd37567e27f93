"""Online login with the identity provider through pam_kioskauth.so: the fallback of a person
without a passcode, a first login at the terminal, the fingerprint offer and enrolment in the same
conversation, a remembered decline, the device-code login, and what the person is told when the
provider refuses or cannot be reached.

Real libpam (the ctypes pam_start_confdir client, and pamtester under pam_wrapper), the real
daemon, the real django-oauth-toolkit server (tests/idp/server.py) on loopback, and libfprint's
virtual readers. Each test starts its own daemon; the tests run as root.
"""

import signal
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest

from fprint_virtual import environment, scan
from idp_testing import (SARAH, Connection, IdentityServer, error_name, have_identity_server, login,
                         make_identity_daemon, ok, person, set_passcode, wait_until)
from kioskauth_testing import as_user, ensure_group
from pam_support import (PAM_AUTH_ERR, PAM_AUTHINFO_UNAVAIL, PAM_MAXTRIES, PAM_SUCCESS, PAM_USER_UNKNOWN, Client, PamConfig,
                         Pamtester, VarlinkConnection, enroll, run_pamtester)
from test_pam import TOUCH, NOT_RECOGNISED, audit, call, module, pam, person  # noqa: F401 (fixtures)
from test_pam_activation import DUPLICATE_CHECK, ENABLE, ENROLLED, LATER, touch_each_stage

pytestmark = pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")

NOOR = ("noor@clinic.example", "pw-noor", "coordinator", "nurses")
EVE = ("eve@elsewhere.example", "pw-eve", "caregiver", "nurses")
ROLF = ("rolf@clinic.example", "pw-rolf", "janitor", "nurses")

FALLBACK = "Biometric login failed. Please sign in with your email and password."
SIGN_IN = "Please sign in with your email and password."
WRONG = "Wrong email or password."
UNREACHABLE = "Your organisation's sign-in cannot be reached. Try again later, or use your finger or passcode."
NOT_ADMITTED = "Your account may not sign in on this terminal."
UNKNOWN_ROLE = "Your account has no role this terminal knows. Ask your coordinator."
WINDOW_ENDED = "Sign in online: this terminal has been offline for too long."
NOT_HERE = "Online sign-in is not possible here."
UNREACHABLE_ONLINE_ONLY = ("Your organisation's sign-in cannot be reached, and you must sign in online before your "
                           "finger or passcode works again. Try again when this terminal is back online, or ask your "
                           "coordinator.")
RENEW = "Sign in online: your organisation's sign-in must be renewed."


def password_prompt(email):
    return f"Password for {email}: "


@pytest.fixture(scope="module")
def idp():
    server = IdentityServer(access_seconds=300, users=(SARAH, NOOR, EVE, ROLF))
    yield server
    server.close()


def start(make_daemon, idp, kind="virtual_device_storage", extra=""):
    """A daemon for `idp` with one virtual reader of `kind` (None: no reader)."""
    d, clock = make_identity_daemon(make_daemon, idp, extra, fingerprints=kind is not None)
    sensor = d.root / "sensor.sock"
    if kind:
        d.extra_env.update(environment(kind, sensor, base={}))
    d.start()
    return d, sensor, clock


def existing(d, sensor, who=SARAH, finger=None):
    """An identity-provider person who logged in once (through the API) and, with `finger`,
    had a finger enrolled by an admin."""
    name = ok(login(d, who[0], who[1]))["person"]["name"]
    if finger:
        enroll(d, sensor, name, finger)
    return name


def stages(d):
    [reader] = call(d, "GetReaders")["parameters"]["readers"]
    return reader["enrollStages"]


# The fallback of a person without a passcode -------------------------------------------------------


def test_three_failed_matches_fall_back_to_email_and_password(make_daemon, idp, pam):
    d, sensor, _ = start(make_daemon, idp)
    name = existing(d, sensor, finger="sarah-finger")
    assert name == SARAH[0] and not person(d, name)["hasPasscode"]
    pam.kioskauth("kioskauth", d.socket)

    c = Client(pam, "kioskauth", name, "authenticate", "acct_mgmt")
    for _ in range(3):
        c.expect(TOUCH)
        scan(sensor, "someone-else")
        c.expect_message(NOT_RECOGNISED)
    c.expect_message(password_prompt(SARAH[0]))
    c.send(SARAH[1])
    results = c.results()
    print("\n".join(c.transcript_lines()))
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 3 + [
        ("error", FALLBACK), ("prompt_echo_off", password_prompt(SARAH[0])), ("info", "Welcome back, Sarah")]
    role = {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Sarah"}
    assert [(r["op"], r["rc"], r["user"], r["env"]) for r in results] == [
        ("authenticate", PAM_SUCCESS, name, role), ("acct_mgmt", PAM_SUCCESS, name, role)]
    # The online login was the fallback: the failure count is cleared, the finger works again.
    assert person(d, name)["fingerprintFailures"] == 0
    [login_event] = [e for e in audit(d, "idp.login") if e.get("service") == "kioskauth"]
    assert login_event["result"] == "success" and login_event["method"] == "idp-password"
    assert SARAH[1] not in d.log_text()
    c = Client(pam, "kioskauth", name, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]

    # A finger-only conversation has no keyboard: the message, and the next stack takes over.
    pam.kioskauth("finger-only", d.socket, "mode=verify max_tries=3")
    c = Client(pam, "finger-only", name, "authenticate")
    for _ in range(3):
        c.expect(TOUCH)
        scan(sensor, "someone-else")
    [result] = c.results()
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL
    assert c.messages()[-1] == ("error", FALLBACK)
    assert not any(style.startswith("prompt") for style, _ in c.messages())


def test_a_wrong_password_is_auth_err_with_one_plain_line(make_daemon, idp, pam):
    d, sensor, _ = start(make_daemon, idp, kind=None)
    name = existing(d, sensor)
    # Keyboard only (a greeter's second conversation): no passcode, so the email and password.
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    p = run_pamtester(pam, "kioskauth", name, "authenticate",
                      answers=[(password_prompt(SARAH[0]), "not the password")])
    assert p.result() == PAM_AUTH_ERR
    assert p.out.splitlines()[0] == SIGN_IN
    assert p.err.startswith(f"{password_prompt(SARAH[0])}{WRONG}\n")
    assert "not the password" not in d.log_text()
    [event] = [e for e in audit(d, "idp.login") if e["result"] == "failure"]
    assert "invalidCredentials" in event["detail"]
    # The right one, through the other client.
    c = Client(pam, "kioskauth", name, "authenticate")
    c.send(SARAH[1])
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, name)
    assert c.messages() == [("info", SIGN_IN), ("prompt_echo_off", password_prompt(SARAH[0])),
                            ("info", "Welcome back, Sarah")]


# A first login at this terminal ---------------------------------------------------------------------


def test_first_login_creates_the_person_and_enrols_a_finger_in_the_same_conversation(make_daemon, idp, pam):
    d, sensor, _ = start(make_daemon, idp)
    colleague = existing(d, sensor, finger="sarah-finger")  # so the new finger is checked against hers
    n = stages(d)
    pam.kioskauth("kioskauth", d.socket)

    # The application names the person (a greeter's user field): unknown here, an email address.
    c = Client(pam, "kioskauth", NOOR[0], "authenticate", "acct_mgmt")
    c.expect_message(password_prompt(NOOR[0]))
    c.send(NOOR[1])
    c.expect_message(ENABLE)
    c.send("y")
    c.expect_message(DUPLICATE_CHECK)
    scan(sensor, "noor-finger")
    touch_each_stage(c, sensor, "noor-finger", n)
    results = c.results()
    print("\n".join(c.transcript_lines()))
    assert c.messages() == [
        ("prompt_echo_off", password_prompt(NOOR[0])),
        ("info", "Welcome, Noor"),
        ("prompt_echo_on", ENABLE),
        ("info", DUPLICATE_CHECK),
        *[("info", f"Touch the reader (stage {i} of {n})…") for i in range(1, n + 1)],
        ("info", ENROLLED),
    ]
    role = {"KIOSKAUTH_ROLE": "coordinator", "KIOSKAUTH_DISPLAY_NAME": "Noor"}
    assert [(r["rc"], r["user"], r["env"]) for r in results] == [(0, NOOR[0], role), (0, NOOR[0], role)]
    noor = person(d, NOOR[0])
    assert (noor["origin"], noor["roles"], noor["fingers"], noor["hasPasscode"]) == (
        "idp", ["coordinator"], ["right-index"], False)
    assert [(e["person"], e["result"]) for e in audit(d, "finger.enroll")] == [
        (colleague, "success"), (NOOR[0], "success")]

    # Next time: the finger, walk-up or by name.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "noor-finger")
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, NOOR[0])
    assert c.messages() == [("info", TOUCH), ("info", "Welcome back, Noor")]
    p = Pamtester(pam, "kioskauth", NOOR[0], "authenticate")
    p.expect(TOUCH)
    scan(sensor, "noor-finger")
    assert p.result() == PAM_SUCCESS and "Password" not in p.err


def test_an_offer_answered_after_the_authentication_went_stale_enrols_nothing(make_daemon, idp, pam):
    """The greeter runs as root, an admin who needs no ticket: the enrolment must still be bound
    to the login that offered it, or whoever answers an abandoned screen enrols their finger."""
    # The ticket expires while the offer waits.
    d, sensor, _ = start(make_daemon, idp, kind="virtual_device", extra="[Access]\nTicketLifetimeSec=2\n")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    c.send(NOOR[1])
    c.expect_message(ENABLE)
    time.sleep(3)
    c.send("y")
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, NOOR[0]), c.transcript
    assert c.messages()[-2:] == [("prompt_echo_on", ENABLE), ("info", LATER)], c.transcript
    assert person(d, NOOR[0])["fingers"] == [] and audit(d, "finger.enroll") == []
    d.stop()

    # The daemon closes the idle connection while the offer waits (the ticket dies with it).
    d, sensor, _ = start(make_daemon, idp, kind="virtual_device", extra="[Socket]\nIdleTimeoutSec=1\n")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    c.send(NOOR[1])
    c.expect_message(ENABLE)
    time.sleep(2.5)
    c.send("y")
    [result] = c.results()
    assert result["rc"] == PAM_SUCCESS, c.transcript
    assert ("info", LATER) in c.messages() and not any("Touch" in text for _, text in c.messages()), c.transcript
    assert person(d, NOOR[0])["fingers"] == [] and audit(d, "finger.enroll") == []


def test_a_ticket_an_admin_presents_is_checked_and_handed_on(make_daemon, idp, pam):
    """Checked: see above. Handed on: root's enrolment keeps the login's authentication for the
    session it opens."""
    d, sensor, _ = start(make_daemon, idp, kind="virtual_device", extra="[Access]\nTicketLifetimeSec=2\n")
    n = stages(d)
    # Root (an admin) with the ticket of a login that has expired: refused before any touch.
    conn = VarlinkConnection(d.socket)
    conn.send({"method": "io.kioskauth.LoginWithPassword", "parameters": {"email": NOOR[0], "password": NOOR[1]}})
    ticket = ok(conn.receive())["ticket"]
    time.sleep(3)
    conn.send({"method": "io.kioskauth.EnrollFinger", "parameters": {"name": NOOR[0], "ticket": ticket},
               "more": True})
    reply = conn.receive()
    assert error_name(reply) == "TicketInvalid", reply
    conn.close()
    [refused] = audit(d, "finger.enroll")
    assert (refused["result"], refused["detail"]) == ("refused", "the presented ticket is not valid")

    # Within its lifetime: the login enrols as root and the session it opens is authenticated,
    # because the enrolment hands the ticket on to root too.
    d.stop()
    d, sensor, _ = start(make_daemon, idp, kind="virtual_device")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", NOOR[0], "authenticate", "open_session")
    c.send(NOOR[1])
    c.expect_message(ENABLE)
    c.send("y")
    touch_each_stage(c, sensor, "noor-finger", n)
    result, opened = c.results()
    assert (result["rc"], opened["rc"]) == (PAM_SUCCESS, PAM_SUCCESS), c.transcript
    assert ("info", ENROLLED) in c.messages()
    [session] = call(d, "ListSessions", {"name": NOOR[0]})["parameters"]["sessions"]
    assert session.get("lastAuthenticationAt") is not None, session


def test_a_declined_offer_is_remembered_and_not_made_again(make_daemon, idp, pam):
    d, _, _ = start(make_daemon, idp, kind="virtual_device")
    # A keyboard conversation with no name yet: the module asks for it, and the daemon's name for
    # the person becomes PAM_USER.
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", None, "authenticate")
    for line in ("Noor@Clinic.Example", NOOR[1], "n"):
        c.send(line)
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]["KIOSKAUTH_ROLE"]) == (PAM_SUCCESS, NOOR[0], "coordinator")
    assert c.messages() == [("prompt_echo_on", "Name: "), ("prompt_echo_off", password_prompt(NOOR[0])),
                            ("info", "Welcome, Noor"), ("prompt_echo_on", ENABLE), ("info", LATER)]
    assert person(d, NOOR[0])["biometricOffer"] is False and person(d, NOOR[0])["fingers"] == []
    [declined] = audit(d, "person.biometric-offer")
    assert (declined["detail"], declined["result"]) == ("declined", "success")

    # The next login, with the reader still there and no finger yet, does not ask again; nor after
    # a daemon restart.
    for _ in range(2):
        c = Client(pam, "kioskauth", NOOR[0], "authenticate")
        c.send(NOOR[1])
        [result] = c.results()
        assert (result["rc"], result["user"]) == (PAM_SUCCESS, NOOR[0])
        assert c.messages() == [("info", SIGN_IN), ("prompt_echo_off", password_prompt(NOOR[0])),
                                ("info", "Welcome back, Noor")]
        d.restart()
    # An admin turns it back on: offered again.
    assert d.ctl("user", "set", NOOR[0], "--biometric-offer", "on").returncode == 0
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    for line in (NOOR[1], "no"):
        c.send(line)
    assert c.results()[0]["rc"] == PAM_SUCCESS
    assert ("prompt_echo_on", ENABLE) in c.messages()


def test_outsiders_and_unknown_roles_are_refused_plainly_and_nobody_is_created(make_daemon, idp, pam):
    d, _, _ = start(make_daemon, idp, kind=None)
    pam.kioskauth("kioskauth", d.socket)
    for who, line in ((EVE, NOT_ADMITTED), (ROLF, UNKNOWN_ROLE)):
        p = run_pamtester(pam, "kioskauth", who[0], "authenticate", answers=[(password_prompt(who[0]), who[1])])
        assert p.result() == PAM_AUTH_ERR, who
        assert p.err.startswith(f"{password_prompt(who[0])}{line}\n"), p.err
    assert call(d, "ListPeople")["parameters"]["people"] == []
    # A wrong password for someone unknown: the same plain line as for anyone.
    p = run_pamtester(pam, "kioskauth", NOOR[0], "authenticate", answers=[(password_prompt(NOOR[0]), "guess")])
    assert p.result() == PAM_AUTH_ERR and p.err.startswith(f"{password_prompt(NOOR[0])}{WRONG}\n")
    # A name that is not an email address is nobody the daemon manages: not even asked.
    p = run_pamtester(pam, "kioskauth", "noor", "authenticate")
    assert p.result() == PAM_USER_UNKNOWN and "Password" not in p.err


def test_without_an_identity_provider_an_unknown_email_is_user_unknown(make_daemon, pam):
    d = make_daemon()
    d.extra_env.update({"FP_DRIVERS_WHITELIST": "virtual_device", "FP_DRIVERS_ALLOWLIST": "virtual_device"})
    d.start()
    pam.kioskauth("kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", NOOR[0], "authenticate")
    assert p.result() == PAM_USER_UNKNOWN and "Password" not in p.err


def test_an_unreachable_or_hanging_provider_is_authinfo_unavail_with_a_line(make_daemon, pam):
    server = IdentityServer(users=(SARAH,))
    try:
        d, sensor, _ = start(make_daemon, server, kind=None)
        name = existing(d, sensor)
        pam.kioskauth("kioskauth", d.socket, "mode=passcode")
        server.kill()
        # Refusing connections: answered at once.
        for user in (name, NOOR[0]):
            c = Client(pam, "kioskauth", user, "authenticate")
            c.send(SARAH[1] if user == name else NOOR[1])
            [result] = c.results()
            assert result["rc"] == PAM_AUTHINFO_UNAVAIL, c.transcript
            assert c.messages()[-1] == ("error", UNREACHABLE)
            assert result["seconds"] < 5
        # Hanging (SIGSTOP): the daemon's request timeout (2 s here) bounds the wait.
        server.start()
        server.stop()
        c = Client(pam, "kioskauth", name, "authenticate")
        c.send(SARAH[1])
        [result] = c.results()
        assert result["rc"] == PAM_AUTHINFO_UNAVAIL and c.messages()[-1] == ("error", UNREACHABLE)
        assert result["seconds"] < 15
        server.cont()
        # Back: the same conversation works.
        c = Client(pam, "kioskauth", name, "authenticate")
        c.send(SARAH[1])
        assert c.results()[0]["rc"] == PAM_SUCCESS
        assert call(d, "ListPeople")["parameters"]["people"][0]["name"] == name  # nobody else created
    finally:
        server.close()


def test_an_ended_offline_window_asks_for_an_online_login_and_reopens_it(make_daemon, idp, pam):
    d, sensor, clock = start(make_daemon, idp, extra="OfflineWindowSec=3600\n")
    name = existing(d, sensor, finger="sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    # Offline for two hours (the provider down, so no background refresh reopens the window).
    idp.kill()
    try:
        clock.advance(2 * 3600)
        # Walk-up: recognised, but the window has ended: the daemon's line, then her password.
        c = Client(pam, "kioskauth", None, "authenticate")
        c.expect(TOUCH)
        scan(sensor, "sarah-finger")
        c.expect_message(password_prompt(SARAH[0]))
    finally:
        idp.start()  # back online
    c.send(SARAH[1])
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, name)
    assert c.messages() == [("info", TOUCH), ("error", WINDOW_ENDED), ("prompt_echo_off", password_prompt(SARAH[0])),
                            ("info", "Welcome back, Sarah")]
    # The window is open again: the finger alone.
    c = Client(pam, "kioskauth", name, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]


def test_an_ended_offline_window_with_the_provider_down_says_what_will_work(make_daemon, idp, pam):
    """Her finger and passcode are refused until she signs in online, and the provider cannot be
    reached: she is not told to use her finger or passcode."""
    d, sensor, clock = start(make_daemon, idp, extra="OfflineWindowSec=3600\n")
    name = existing(d, sensor, finger="sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    idp.kill()
    try:
        clock.advance(2 * 3600)
        c = Client(pam, "kioskauth", None, "authenticate")
        c.expect(TOUCH)
        scan(sensor, "sarah-finger")
        c.expect_message(password_prompt(SARAH[0]))
        c.send(SARAH[1])
        [result] = c.results()
    finally:
        idp.start()
    assert (result["rc"], result["user"]) == (PAM_AUTHINFO_UNAVAIL, None)
    assert c.messages() == [("info", TOUCH), ("error", WINDOW_ENDED), ("prompt_echo_off", password_prompt(SARAH[0])),
                            ("error", UNREACHABLE_ONLINE_ONLY)]
    assert name


def suspend_by_revocation(d, idp, name):
    """The provider revokes her tokens; the daemon's next refresh is refused (invalid_grant) and
    suspends her local unlock until she signs in online. The caller has moved the daemon's clock
    close to the access token's expiry, so the background refresh runs now."""
    idp.control("revoke-user-tokens", {"email": SARAH[0]})
    wait_until(lambda: person(d, name).get("suspendedReason"), 60, message="the suspension")
    assert person(d, name)["state"] == "suspended"


def test_a_suspended_identity_provider_person_named_at_the_prompt_signs_in_online(make_daemon, idp, pam):
    """Her local unlock is suspended (the provider revoked her token): with her name given, the
    module does not dead-end at "Your account is suspended." but asks her to sign in online,
    which lifts the suspension."""
    d, sensor, clock = start(make_daemon, idp, kind=None)
    name = existing(d, sensor)
    set_passcode(d, name)
    clock.advance(280)
    suspend_by_revocation(d, idp, name)
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", name, "authenticate")
    c.expect_message(password_prompt(SARAH[0]))
    c.send(SARAH[1])
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, name)]
    assert ("error", RENEW) in c.messages()
    assert person(d, name)["state"] == "active"


def test_a_recognised_person_whose_local_unlock_is_suspended_signs_in_online(make_daemon, idp, pam):
    """Walk-up recognises her although her local unlock is suspended (her refresh token was
    rejected): she is asked to sign in online, not told her finger is unknown, and the touch does
    not count towards the terminal's identify pause."""
    d, sensor, clock = start(make_daemon, idp, extra="\n[Fingerprint]\nIdentifyPauseAfter=1\nIdentifyPauseSec=600\n")
    name = existing(d, sensor, finger="sarah-finger")
    clock.advance(280)
    suspend_by_revocation(d, idp, name)
    pam.kioskauth("kioskauth", d.socket)
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    c.expect_message(password_prompt(SARAH[0]))
    c.send(SARAH[1])
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, name)]
    assert c.messages() == [("info", TOUCH), ("error", RENEW), ("prompt_echo_off", password_prompt(SARAH[0])),
                            ("info", "Welcome back, Sarah")]
    [event] = audit(d, "finger.identify")
    assert event["result"] == "refused" and event["person"] == name
    # Identify is not paused: the next walk-up asks for a finger.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, name)]


def test_no_online_login_over_a_remote_session(make_daemon, idp, pam):
    d, sensor, _ = start(make_daemon, idp, kind=None)
    name = existing(d, sensor)
    for mode in ("auto", "passcode"):
        pam.kioskauth("kioskauth", d.socket, f"mode={mode}")
        for user, expected in ((name, PAM_AUTHINFO_UNAVAIL), (NOOR[0], PAM_USER_UNKNOWN)):
            c = Client(pam, "kioskauth", user, "authenticate", items={"rhost": "laptop.example.org"})
            [result] = c.results()
            assert result["rc"] == expected, (mode, user, c.transcript)
            assert c.messages() == [], (mode, user, c.transcript)
    assert len(audit(d, "idp.login")) == 1  # only the API login above


def test_online_login_follows_the_passcode_service_rules_and_shows_nobodys_email(make_daemon, idp, pam):
    """`su sarah` run by anyone (su sets no PAM_RHOST), or a service not allowed passcodes, does
    not reach the organisation's sign-in: no password prompt, and her email is not shown."""
    d, sensor, _ = start(make_daemon, idp, kind=None)
    name = existing(d, sensor)
    for service in ("su", "sshd"):
        pam.kioskauth(service, d.socket, "mode=passcode")
        for user in (name, NOOR[0]):  # known here, and a first login
            c = Client(pam, service, user, "authenticate")
            [result] = c.results()
            assert result["rc"] == PAM_AUTHINFO_UNAVAIL, (service, user, c.transcript)
            assert not any(style.startswith("prompt") for style, _ in c.messages()), c.transcript
            assert not any(SARAH[0] in text for _, text in c.messages()), c.transcript
            assert c.messages()[-1] == ("error", NOT_HERE)
    # The daemon itself refuses before asking the provider: from su (ruid 0 is nobody's person),
    # from a service not allowed passcodes, and over a remote session, each audited.
    contexts = [{"service": "su", "ruid": 0, "remote": False}, {"service": "sshd", "ruid": 0, "remote": False},
                {"service": "kioskauth", "ruid": 0, "remote": False, "remoteHost": "laptop.example.org"}]
    for context in contexts:
        reply = Connection(d.socket).call(
            "LoginWithPassword", {"email": SARAH[0], "password": SARAH[1], "context": context})
        assert error_name(reply) == "OnlineLoginNotAllowed", reply
        reply = Connection(d.socket).call("CheckOnlineLogin", {"name": name, "context": context})
        assert error_name(reply) == "OnlineLoginNotAllowed" and "email" not in reply.get("parameters", {}), reply
    events = audit(d, "idp.login")
    assert [e["result"] for e in events] == ["success"] + ["refused"] * (4 + 2 * len(contexts)), events
    # Where it is allowed, the email comes with the answer.
    reply = Connection(d.socket).call("CheckOnlineLogin", {"name": name, "context": {"service": "kioskauth",
                                                                                     "ruid": 0}})
    assert ok(reply) == {"email": SARAH[0]}


def test_wrong_passwords_pause_online_logins_on_the_terminal(make_daemon, idp, pam):
    d, sensor, _ = start(make_daemon, idp, kind=None, extra="LoginMaxFailures=2\nLoginFailureWindowSec=600\n")
    name = existing(d, sensor)
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    for _ in range(2):
        p = run_pamtester(pam, "kioskauth", name, "authenticate", answers=[(password_prompt(SARAH[0]), "guess")])
        assert p.result() == PAM_AUTH_ERR
    # Paused: not even asked, with the wait; the right password through the API is refused too.
    c = Client(pam, "kioskauth", name, "authenticate")
    [result] = c.results()
    assert result["rc"] == PAM_MAXTRIES, c.transcript
    [(style, line)] = c.messages()
    assert style == "error" and line.startswith("Too many wrong passwords on this terminal. Try again in 10 minutes")
    reply = login(d)
    assert error_name(reply) == "OnlineLoginPaused" and 0 < reply["parameters"]["retryAfterSeconds"] <= 600
    # A restart does not lift it.
    d.restart()
    assert error_name(login(d)) == "OnlineLoginPaused"
    assert [e["detail"] for e in audit(d, "idp.login") if e["result"] == "refused"] == [
        "paused after too many wrong passwords"] * 3


# The device-code login --------------------------------------------------------------------------------


def device_prompt(c):
    """Waits for the line that shows the code; returns the code."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for style, text in c.messages():
            if style == "info" and text.startswith("To sign in, open "):
                return text.split(" enter the code ", 1)[1].split(" within ", 1)[0]
        time.sleep(0.05)
    raise AssertionError(f"no device code shown:\n{c.transcript}")


def test_device_login_shows_the_code_and_waits_and_ctrl_c_ends_it(make_daemon, idp, pam):
    d, _, _ = start(make_daemon, idp, kind=None)
    pam.kioskauth("kioskauth", d.socket, "idp_login=device")

    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    code = device_prompt(c)
    [(_, shown)] = c.messages()
    assert shown.startswith(f"To sign in, open {idp.issuer}/device/ on your phone and enter the code {code} within ")
    time.sleep(1.5)  # the daemon polls; the person types the code on their phone
    idp.control("approve-device", {"user_code": code, "email": NOOR[0]})
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]["KIOSKAUTH_ROLE"]) == (PAM_SUCCESS, NOOR[0], "coordinator")
    assert c.messages()[-1] == ("info", "Welcome, Noor")
    assert [e["method"] for e in audit(d, "idp.login")] == ["idp-device"]

    # Someone else approves on the phone for a named person: refused.
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    idp.control("approve-device", {"user_code": device_prompt(c), "email": SARAH[0]})
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_AUTH_ERR, NOOR[0])
    assert c.messages()[-1] == ("error", "You signed in as someone else. Sign in with your own account.")

    # Declined on the phone.
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    idp.control("approve-device", {"user_code": device_prompt(c), "email": NOOR[0], "deny": True})
    [result] = c.results()
    assert result["rc"] == PAM_AUTH_ERR and c.messages()[-1] == ("error", "The sign-in was declined.")

    # Ctrl-C while waiting ends the wait at once.
    c = Client(pam, "kioskauth", NOOR[0], "authenticate")
    device_prompt(c)
    c.interrupt()
    assert c.wait(30) in (0, -signal.SIGINT)
    [result] = [e for e in c.events() if e["event"] == "result"]
    assert result["rc"] == PAM_AUTH_ERR and result["seconds"] < 10


# A kiosk app that is not root ----------------------------------------------------------------------------


def test_a_kiosk_app_in_the_kioskauth_group_signs_in_and_enrols_with_the_logins_ticket(make_daemon, idp):
    """Not root, so not an admin: the enrolment needs the ticket of the login on its connection."""
    d, sensor, _ = start(make_daemon, idp, kind="virtual_device")
    n = stages(d)
    ensure_group("kioskauth")
    shared = Path(tempfile.mkdtemp(prefix="kioskauth-pam-"))
    shared.chmod(0o755)
    pam = PamConfig(shared)
    pam.kioskauth("kioskauth", d.socket)
    c = Client(pam, "kioskauth", NOOR[0], "authenticate", "open_session",
               run_as=as_user([], "nobody", ["kioskauth"]), python="/usr/bin/python3")
    c.expect_message(password_prompt(NOOR[0]))
    c.send(NOOR[1])
    c.expect_message(ENABLE)
    c.send("y")
    touch_each_stage(c, sensor, "noor-finger", n)
    result, opened = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, NOOR[0]), c.transcript
    # The enrolment used the login's ticket up and handed it on: the session opened by the same
    # conversation counts the online login as its authentication.
    assert opened["rc"] == PAM_SUCCESS, c.transcript
    [s] = call(d, "ListSessions", {"name": NOOR[0]})["parameters"]["sessions"]
    assert s["state"] == "active" and s.get("lastAuthenticationAt") is not None
    assert ("info", ENROLLED) in c.messages()
    assert person(d, NOOR[0])["fingers"] == ["right-index"]
    assert [(e["action"], e["result"], e["callerUid"]) for e in call(d, "GetAudit", {})["parameters"]["events"]
            if e["action"] in ("idp.login", "finger.enroll")] == [
        ("idp.login", "success", 65534), ("finger.enroll", "success", 65534)]
