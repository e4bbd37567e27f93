"""Sessions through pam_kioskauth.so: open_session registers the session with the daemon (so its
idle, overnight, lock and step-up rules apply), close_session ends it, and KIOSKAUTH_SESSION tells
the application which session it holds.

Real libpam (the ctypes pam_start_confdir client, and pamtester under pam_wrapper) against the
real daemon; the tests run as root, one as nobody in the kioskauth group.
"""

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from idp_testing import SARAH, IdentityServer, have_identity_server, login, make_identity_daemon, ok
from kioskauth_testing import as_user, ensure_group
from pam_support import (MODULE, PAM_PERM_DENIED, PAM_SESSION_ERR, PAM_SUCCESS, REPO, Client, PamConfig,
                         run_pamtester, security_dir)
from test_pam import PASSCODE, add_person, audit, call, module, pam, start, unix_user  # noqa: F401 (fixtures)

UNAVAILABLE = "The login service is not available."


def sessions(d, name=None):
    return call(d, "ListSessions", {"name": name} if name else {})["parameters"]["sessions"]


def session_stack(pam, service, socket_path, auth="", options="mode=passcode"):
    """auth: this module (or `auth`, e.g. pam_permit); session: the module, whose every answer
    but PAM_SUCCESS and PAM_IGNORE ends the stack with its own code, then pam_permit."""
    line = f"{MODULE} socket={socket_path} {options}"
    permit = security_dir() / "pam_permit.so"
    return pam.add(service, f"auth required {auth or line}\n"
                            f"account required {permit}\n"
                            f"session [success=ok ignore=ignore default=die] {line}\n"
                            f"session required {permit}\n")


def ignore_probe(pam, service, socket_path, auth):
    """As above, but a session the module opens goes on to pam_deny: PAM_SUCCESS only when the
    module answered PAM_IGNORE."""
    line = f"{MODULE} socket={socket_path}"
    permit, deny = security_dir() / "pam_permit.so", security_dir() / "pam_deny.so"
    return pam.add(service, f"auth required {auth}\n"
                            f"session [success=ok ignore=1 default=die] {line}\n"
                            f"session requisite {deny}\n"
                            f"session required {permit}\n")


def result_of(results, op):
    [r] = [r for r in results if r["op"] == op]
    return r


# Open and close -------------------------------------------------------------------------------------


def test_open_session_registers_it_with_service_and_tty_and_close_ends_it(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah", "Sarah Lee")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "acct_mgmt", "open_session", "pause", "close_session",
               items={"tty": "tty7"})
    c.send(PASSCODE)
    c.expect('"paused"')

    # Open: in the daemon's list with the PAM service and tty, started by this authentication.
    opened = result_of([e for e in c.events() if e["event"] == "result"], "open_session")
    assert opened["rc"] == PAM_SUCCESS
    [s] = sessions(d)
    assert (s["name"], s["service"], s["tty"], s["state"]) == ("sarah", "kioskauth", "tty7", "active")
    assert s.get("lastAuthenticationAt") is not None  # the auth's ticket was handed over
    assert opened["env"] == {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Sarah Lee",
                             "KIOSKAUTH_SESSION": s["id"]}
    listed = d.ctl("session", "list")
    assert listed.returncode == 0 and "sarah" in listed.stdout and "kioskauth" in listed.stdout
    assert s["id"][:12] in listed.stdout
    assert [x["id"] for x in json.loads(d.ctl("session", "list", "--json").stdout)["sessions"]] == [s["id"]]
    # The application uses the id: step-up is satisfied by the login that opened the session.
    assert ok_params(call(d, "StepUp", {"id": s["id"], "maxAgeSeconds": 300}))["satisfied"] is True

    # Close: gone from the list, and the variable with it.
    c.send("")
    closed = result_of(c.results(), "close_session")
    assert closed["rc"] == PAM_SUCCESS and "KIOSKAUTH_SESSION" not in closed["env"]
    assert sessions(d) == []
    [opened_event] = audit(d, "session.open")
    assert opened_event["service"] == "kioskauth" and opened_event["detail"].endswith("; authenticated")
    [ended] = audit(d, "session.end")
    assert ended["detail"] == f"{s['id'][:8]}: loggedOut"


def ok_params(reply):
    assert "error" not in reply, reply
    return reply["parameters"]


def test_the_shipped_service_opens_and_closes_sessions_with_pamtester(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.shipped("kioskauth", REPO / "pam" / "pam.d" / "kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", "acct_mgmt", "open_session", "close_session",
                      answers=[("Passcode: ", PASSCODE)], items={"tty": "tty3"})
    assert p.result() == PAM_SUCCESS, p.transcript
    assert "successfully opened a session" in p.out and "session has successfully been closed" in p.out
    [opened] = audit(d, "session.open")
    assert opened["person"] == "sarah" and opened["detail"].endswith("; authenticated")
    assert [e["detail"][10:] for e in audit(d, "session.end")] == ["loggedOut"]
    assert sessions(d) == []


def test_a_session_that_already_ended_closes_without_error(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "open_session", "pause", "close_session")
    c.send(PASSCODE)
    c.expect('"paused"')
    assert d.ctl("session", "end", "sarah").returncode == 0  # the security logout
    c.send("")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS] * 3


# Who gets a session ---------------------------------------------------------------------------------


def test_open_session_ignores_people_the_daemon_does_not_manage(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    ignore_probe(pam, "probe", d.socket, auth=security_dir() / "pam_permit.so")
    for user in ("bob", "Not-A-Kioskauth-Name"):
        c = Client(pam, "probe", user, "authenticate", "open_session")
        results = c.results()
        assert [r["rc"] for r in results] == [PAM_SUCCESS, PAM_SUCCESS], (user, c.transcript)
        assert "KIOSKAUTH_SESSION" not in results[-1]["env"] and c.messages() == []
    assert sessions(d) == []
    # The probe tells PAM_IGNORE from a session: for a kioskauth person it ends in pam_deny.
    c = Client(pam, "probe", "sarah", "authenticate", "open_session")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SESSION_ERR]  # pam_deny's session code
    [s] = sessions(d)
    assert s.get("lastAuthenticationAt") is None  # pam_permit authenticated: no ticket to hand over


def test_a_daemon_gone_at_open_session_refuses_after_our_auth_and_is_ignored_otherwise(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    session_stack(pam, "kioskauth", d.socket)
    ignore_probe(pam, "other-auth", d.socket, auth=security_dir() / "pam_permit.so")
    c = Client(pam, "kioskauth", "sarah", "authenticate", "pause", "open_session")
    c.send(PASSCODE)
    c.expect('"paused"')
    d.stop()
    c.send("")
    results = c.results()
    assert [(r["op"], r["rc"]) for r in results] == [("authenticate", PAM_SUCCESS), ("open_session", PAM_SESSION_ERR)]
    assert c.messages()[-1] == ("error", UNAVAILABLE)
    assert "KIOSKAUTH_SESSION" not in results[-1]["env"]
    # Another module authenticated: not this module's call.
    c = Client(pam, "other-auth", "sarah", "authenticate", "open_session")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SUCCESS] and c.messages() == []


def test_the_daemon_refusing_a_session_is_session_err_with_its_reason(make_daemon, pam):
    d, _ = start(make_daemon)
    assert "error" not in call(d, "AddPerson", {"name": "lena", "displayName": "Lena"})  # pending activation
    session_stack(pam, "kioskauth", d.socket, auth=security_dir() / "pam_permit.so")
    c = Client(pam, "kioskauth", "lena", "authenticate", "open_session")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SESSION_ERR]
    assert c.messages() == [("error", "Your account is not activated yet.")]
    assert sessions(d) == []


@pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")
def test_no_session_for_an_identity_provider_person_outside_the_offline_window(make_daemon, pam):
    server = IdentityServer(users=(SARAH,))
    try:
        d, clock = make_identity_daemon(make_daemon, server, "OfflineWindowSec=3600\n")
        d.start()
        name = ok(login(d))["person"]["name"]
        session_stack(pam, "kioskauth", d.socket, auth=security_dir() / "pam_permit.so")
        c = Client(pam, "kioskauth", name, "authenticate", "open_session")
        assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SUCCESS]
        server.kill()  # no background refresh reopens the window
        clock.advance(2 * 3600)
        c = Client(pam, "kioskauth", name, "authenticate", "open_session")
        assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SESSION_ERR]
        assert c.messages() == [("error", "Sign in online: this terminal has been offline for too long.")]
    finally:
        server.close()


# The hand-over of the authentication ------------------------------------------------------------------


def test_without_the_auth_connection_the_session_opens_unauthenticated(make_daemon, pam):
    """The daemon closes idle connections after 1 s here: the connection auth kept is gone by
    open_session, so the session opens without the ticket (and step-up will ask)."""
    d, _ = start(make_daemon, config="\n[Socket]\nIdleTimeoutSec=1\n")
    add_person(d, "sarah")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "pause", "open_session")
    c.send(PASSCODE)
    c.expect('"paused"')
    time.sleep(2)
    c.send("")
    results = c.results()
    assert [r["rc"] for r in results] == [PAM_SUCCESS, PAM_SUCCESS]
    [s] = sessions(d)
    assert s["id"] == results[-1]["env"]["KIOSKAUTH_SESSION"] and s.get("lastAuthenticationAt") is None
    assert ok_params(call(d, "StepUp", {"id": s["id"], "maxAgeSeconds": 300}))["satisfied"] is False


def test_the_ticket_goes_only_to_the_person_it_was_earned_for(make_daemon, pam):
    """Something after this module's auth changes PAM_USER: account and session fail closed, and
    nobody gets a session on the strength of the person this module authenticated."""
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    add_person(d, "omar")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "set_user", "open_session")
    c.send(PASSCODE)
    c.send("omar")
    results = c.results()
    assert [(r["rc"], r["user"]) for r in results] == [(PAM_SUCCESS, "sarah"), (PAM_SESSION_ERR, "omar")]
    assert sessions(d) == []
    pam.kioskauth("login", d.socket, "mode=passcode")
    c = Client(pam, "login", "sarah", "authenticate", "set_user", "acct_mgmt")
    c.send(PASSCODE)
    c.send("omar")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_PERM_DENIED]


def test_a_later_auth_forgets_what_an_earlier_one_authenticated(make_daemon, pam):
    """The handle is authenticated again for someone this module does not manage (another
    module lets them in): the account step is that module's business, not a fail-closed refusal
    left over from the first auth."""
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    line = f"{MODULE} socket={d.socket} mode=passcode"
    permit = security_dir() / "pam_permit.so"
    pam.add("login", f"auth sufficient {line}\nauth required {permit}\n"
                     f"account [success=ok user_unknown=ignore default=die] {line}\naccount required {permit}\n")
    c = Client(pam, "login", "sarah", "authenticate", "set_user", "authenticate", "acct_mgmt")
    c.send(PASSCODE)
    c.send("carol")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "sarah"), (PAM_SUCCESS, "carol"),
                                                           (PAM_SUCCESS, "carol")], c.transcript


def test_an_unanswered_ticketed_open_session_is_not_sent_again_without_the_ticket(make_daemon, pam):
    """The daemon stops answering after it read the ticketed OpenSession: a second call without
    the ticket could register a second session, so there is none, and the session fails."""
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "pause", "open_session")
    c.send(PASSCODE)
    c.expect('"paused"')
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        c.send("")
        results = c.results()
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert [r["rc"] for r in results] == [PAM_SUCCESS, PAM_SESSION_ERR], c.transcript
    assert results[-1]["seconds"] < 15
    time.sleep(1)
    assert len(sessions(d)) == 1  # the ticketed call, once the daemon went on; no second one


def test_a_kiosk_app_in_the_kioskauth_group_opens_and_closes_authenticated_sessions(make_daemon, module):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    ensure_group("kioskauth")
    shared = Path(tempfile.mkdtemp(prefix="kioskauth-pam-"))
    shared.chmod(0o755)
    pam = PamConfig(shared)
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "open_session", "pause", "close_session",
               run_as=as_user([], "nobody", ["kioskauth"]), python="/usr/bin/python3", items={"tty": "tty1"})
    c.send(PASSCODE)
    c.expect('"paused"')
    [s] = sessions(d)
    assert (s["name"], s["service"], s["tty"]) == ("sarah", "kioskauth", "tty1")
    assert s.get("lastAuthenticationAt") is not None
    c.send("")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS] * 3
    assert sessions(d) == []
    assert [e["callerUid"] for e in audit(d, "session.open")] == [65534]


# The shipped desktop-login stacks -----------------------------------------------------------------


def common_session(profile: Path, socket_path: str) -> str:
    """common-session as pam-auth-update composes it from this profile and Debian's unix profile
    (both Additional; ours first by priority)."""
    text = profile.read_text()
    assert "Session-Type: Additional" in text and "Session-Interactive-Only: yes" in text
    ours = text.split("Session:\n", 1)[1].splitlines()[0].strip()
    ours = ours.replace("pam_kioskauth.so", f"{MODULE} socket={socket_path}")
    return ("session [default=1] pam_permit.so\nsession requisite pam_deny.so\nsession required pam_permit.so\n"
            f"session {ours}\nsession required pam_unix.so\n")


def test_the_greeter_stack_and_the_debian_profile_register_sessions_and_fail_closed(make_daemon, pam, unix_user):
    from test_pam import debian_common

    d, _ = start(make_daemon)
    # Desktop-login stacks need a Unix account too: the person is bound to the account's uid.
    root, uid = unix_user()
    add_person(d, root, uid=uid)
    profile = REPO / "pam" / "pam-configs" / "kioskauth"
    services = {"lightdm": pam.shipped("lightdm", REPO / "pam" / "examples" / "greeter", d.socket),
                "login": pam.add("login", debian_common(profile, d.socket) + common_session(profile, d.socket))}
    for service in services:
        c = Client(pam, service, root, "authenticate", "acct_mgmt", "open_session", "pause", "close_session",
                   items={"tty": "tty1"})
        c.send(PASSCODE)
        c.expect('"paused"')
        [s] = sessions(d)
        assert (s["name"], s["service"], s["tty"]) == (root, service, "tty1"), service
        c.send("")
        results = c.results()
        assert [r["rc"] for r in results] == [PAM_SUCCESS] * 4, (service, c.transcript)
        assert results[2]["env"]["KIOSKAUTH_SESSION"] == s["id"]
        assert sessions(d) == []
    # The daemon gone between this module's auth and the session: no session.
    for service in services:
        c = Client(pam, service, root, "authenticate", "pause", "open_session")
        c.send(PASSCODE)
        c.expect('"paused"')
        d.stop()
        c.send("")
        assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SESSION_ERR], (service, c.transcript)
        d.start()


def test_a_kept_connection_whose_number_the_application_reused_is_neither_used_nor_closed(make_daemon, pam):
    """Auth keeps its connection for open_session by descriptor number. An application that closes
    descriptors in between and opens others (here /dev/null on the same numbers) must not have
    the module talk to, or close, what is now its own descriptor: the session opens on a new
    connection without the ticket."""
    d, _ = start(make_daemon)
    add_person(d, "sarah", "Sarah Lee")
    session_stack(pam, "kioskauth", d.socket)
    c = Client(pam, "kioskauth", "sarah", "authenticate", "reuse_fds", "open_session")
    c.send(PASSCODE)
    results = c.results()
    assert [r["rc"] for r in results] == [PAM_SUCCESS, PAM_SUCCESS], c.transcript
    [reused] = [e["fds"] for e in c.events() if e["event"] == "reused"]
    assert reused, "auth kept no connection for the session"
    [s] = sessions(d)
    assert s["state"] == "active" and s.get("lastAuthenticationAt") is None
    [ended] = [e for e in c.events() if e["event"] == "ended"]
    assert set(reused) <= set(ended["open_fds"]), "the module closed the application's descriptors"
