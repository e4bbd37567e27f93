"""Who gets a session's access token (issue #11, item 2): a session opens only with a ticket of a
fresh authentication of its person on the same connection, and GetSessionToken answers only on the
connection that presented the session's latest authentication, while that authentication stands.
The callers are real processes of other uids and groups (a kiosk app in the kioskauth group)."""

import grp
import json
import os
import pwd

import pytest

from idp_testing import (
    SARAH, Connection, IdentityServer, audit_events, error_name, have_identity_server, login,
    make_identity_daemon, ok,
)

pytestmark = pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")


def as_process(user: str, groups: list[str], body):
    """Runs body(connection_factory) in a forked child with `user`'s uid and exactly `groups`;
    returns what it returned (JSON)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            entry = pwd.getpwnam(user)
            os.setgroups([grp.getgrnam(g).gr_gid for g in groups])
            os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
            os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
            result = body()
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"null")


def names(replies):
    return [error_name(r) or "ok" for r in replies]


def test_only_the_authenticating_connection_gets_a_session_token(make_daemon):
    idp = IdentityServer(access_seconds=300, refresh_seconds=600)
    try:
        d, _ = make_identity_daemon(make_daemon, idp)
        d.start()
        # Root (a greeter) signs sarah in and opens her session with the ticket on connection A.
        a = Connection(d.socket)
        signed = ok(login(d, conn=a))
        name = signed["person"]["name"]
        sid = ok(a.call("OpenSession", {"name": name, "ticket": signed["ticket"]}))["session"]["id"]
        assert ok(a.call("GetSessionToken", {"id": sid}))["accessToken"]
        # A ticket earned on another connection, for the attacker to present.
        b = Connection(d.socket)
        foreign = ok(login(d, conn=b))["ticket"]

        def kiosk_app_attack():
            conn = Connection(d.socket)
            replies = [
                conn.call("OpenSession", {"name": name}),  # the reproduction: no ticket
                conn.call("OpenSession", {"name": name, "ticket": foreign}),  # someone else's ticket
                conn.call("GetSessionToken", {"id": sid}),  # the session root opened
            ]
            conn.close()
            return replies

        replies = as_process("nobody", ["kioskauth"], kiosk_app_attack)
        assert names(replies) == ["TicketInvalid", "TicketInvalid", "SessionNotAuthenticated"], replies
        assert all("accessToken" not in json.dumps(r) for r in replies)
        # Nothing was opened by the refused calls.
        assert [s["id"] for s in ok(d.call("io.kioskauth.ListSessions"))["sessions"]] == [sid]

        # A lock stops the release on A too, until a fresh authentication on A.
        ok(a.call("LockSession", {"id": sid}))
        assert error_name(a.call("GetSessionToken", {"id": sid})) == "SessionLocked"
        fresh = ok(login(d, conn=a))["ticket"]
        ok(a.call("AuthenticateSession", {"id": sid, "ticket": fresh}))
        assert ok(a.call("GetSessionToken", {"id": sid}))["accessToken"]

        # The documented kiosk-app flow: it authenticates the person on its own connection and
        # authenticates the session with that ticket; from then on the token is its, not A's.
        def kiosk_app_flow():
            conn = Connection(d.socket)
            ticket = conn.call("LoginWithPassword", {"email": SARAH[0], "password": SARAH[1]})["parameters"]["ticket"]
            replies = [conn.call("AuthenticateSession", {"id": sid, "ticket": ticket}),
                       conn.call("GetSessionToken", {"id": sid})]
            conn.close()
            return replies

        replies = as_process("nobody", ["kioskauth"], kiosk_app_flow)
        assert names(replies) == ["ok", "ok"], replies
        assert replies[1]["parameters"]["accessToken"]
        assert error_name(a.call("GetSessionToken", {"id": sid})) == "SessionNotAuthenticated"

        # Every release and refusal is audited, without the token.
        token_rows = [e for e in audit_events(d) if e["action"] == "session.token"]
        assert [e["result"] for e in token_rows].count("success") == 3
        assert [e["result"] for e in token_rows].count("refused") >= 3
        opens = [e for e in audit_events(d) if e["action"] == "session.open" and e["result"] == "refused"]
        assert len(opens) == 2
        a.close()
        b.close()
    finally:
        idp.close()
