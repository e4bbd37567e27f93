"""Sign-in against identity providers as organisations run them: django-oauth-toolkit and
django-oidc-provider from PyPI, unmodified, configured only through their documented settings
(tests/idp/plain_server.py, tests/idp/README.md). tests/idp/server.py stays for fault injection.

DOT issues no ID token for the password grant and its userinfo carries only `sub`; neither
server has a role claim. django-oidc-provider issues ID tokens, lists no scopes_supported,
has no revocation endpoint and no device grant.
"""

import json
import time

import pytest

from idp_testing import (
    Connection, PlainProvider, audit_events, error_name, have_plain_provider, login, make_plain_daemon, ok, person,
    plain_config, set_passcode, wait_until,
)

ALICE = ("alice@example.com", "alice pw 1", [])
BOB = ("bob@example.com", "bob pw 2", ["leads"])
CAROL = ("carol@example.com", "carol pw 3", ["nurses"])
USERS = (ALICE, BOB, CAROL)
PROVIDERS = ["dot", "oidc-provider"]
PASSCODE = "482913"


def skip_without(provider):
    if not have_plain_provider(provider):
        pytest.skip(f"{provider} is not installed")


@pytest.fixture(scope="module", params=PROVIDERS)
def provider(request):
    skip_without(request.param)
    server = PlainProvider(request.param, users=USERS, publish_groups=True)
    yield server
    server.close()


def scopes_for(provider):
    # django-oidc-provider lists no scopes_supported, so the scopes are the admin's to choose.
    return "Scopes=openid email groups\n"


def test_first_login_with_default_role_and_the_same_person_again(make_daemon, provider):
    d, _ = make_plain_daemon(make_daemon, provider, "DefaultRole=caregiver\n")
    d.start()
    assert error_name(login(d, ALICE[0], "wrong")) == "WrongCredentials"
    reply = ok(login(d, ALICE[0], ALICE[1]))
    assert reply["created"] is True
    p = reply["person"]
    assert (p["origin"], p["roles"], p["email"]) == ("idp", ["caregiver"], ALICE[0])
    again = ok(login(d, ALICE[0], ALICE[1]))
    assert again["created"] is False and again["person"]["name"] == p["name"]
    success = [e for e in audit_events(d) if (e["action"], e["result"]) == ("idp.login", "success")]
    assert "roles=caregiver (from DefaultRole)" in success[0]["detail"]
    if provider.provider == "dot":
        # No ID token, userinfo with only `sub`: the typed name is the email, and the audit says so.
        assert "email as typed at sign-in" in success[0]["detail"]
        # DOT lists only openid and email: profile (a default scope) is dropped, in the journal.
        assert "not requesting a configured scope" in d.log_text() and "profile" in d.log_text()
    else:
        # The email came from userinfo (the ID token carries only the required claims).
        assert "email as typed" not in success[0]["detail"]


def test_without_a_role_claim_or_default_role_nobody_is_signed_in(make_daemon, provider):
    d, _ = make_plain_daemon(make_daemon, provider, scopes_for(provider))
    d.start()
    refused = login(d, ALICE[0], ALICE[1])
    assert error_name(refused) == "UnknownRole"
    assert "DefaultRole" in refused["parameters"]["reason"]
    assert ok(d.call("io.kioskauth.ListPeople"))["people"] == []


def test_groups_map_to_roles(make_daemon, provider):
    d, _ = make_plain_daemon(
        make_daemon, provider,
        scopes_for(provider) + "RoleFromGroup=leads:coordinator\nRoleFromGroup=nurses:caregiver\n")
    d.start()
    assert ok(login(d, BOB[0], BOB[1]))["person"]["roles"] == ["coordinator"]
    assert ok(login(d, CAROL[0], CAROL[1]))["person"]["roles"] == ["caregiver"]
    assert error_name(login(d, ALICE[0], ALICE[1])) == "UnknownRole"  # in no mapped group, no default
    detail = [e["detail"] for e in audit_events(d) if e["action"] == "idp.login" and e["result"] == "success"]
    assert "from group leads" in detail[0]


def test_refresh_rotates_and_a_token_revoked_at_the_provider_suspends(make_daemon):
    for name in PROVIDERS:
        skip_without(name)
        server = PlainProvider(name, users=USERS, access_seconds=3, refresh_seconds=600)
        try:
            d, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\n")
            d.start()
            who = ok(login(d, ALICE[0], ALICE[1]))["person"]["name"]
            set_passcode(d, who, PASSCODE)
            first = person(d, who)["lastOnlineContactAt"]
            wait_until(lambda: person(d, who)["lastOnlineContactAt"] != first, 20, message=f"{name}: a refresh")
            second = person(d, who)["lastOnlineContactAt"]
            wait_until(lambda: person(d, who)["lastOnlineContactAt"] != second, 20, message=f"{name}: a 2nd refresh")
            assert person(d, who)["state"] == "active"
            # The administrator revokes her tokens at the provider: the next refresh is refused.
            server.admin("revoke-user-tokens", email=ALICE[0])
            wait_until(lambda: person(d, who).get("suspendedReason"), 20, message=f"{name}: the suspension")
            assert person(d, who)["suspendedReason"] == "refresh-token-rejected"
            ok(login(d, ALICE[0], ALICE[1]))
            assert person(d, who)["state"] == "active"
            d.stop()
        finally:
            server.close()


def test_removing_a_person_revokes_at_dot_with_rfc7009(make_daemon):
    skip_without("dot")
    server = PlainProvider("dot", users=USERS)
    try:
        d, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\n")
        d.start()
        who = ok(login(d, ALICE[0], ALICE[1]))["person"]["name"]
        assert d.ctl("user", "remove", who).returncode == 0
        wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["outboxPending"] == 0, 20, message="delivery")
        delivered = [e["detail"] for e in audit_events(d) if e["action"] == "idp.revoke"]
        assert delivered[-1] == "queued revocation delivered"
        import sqlite3

        with sqlite3.connect(server.state_dir / "idp.sqlite3") as db:
            live = db.execute("SELECT COUNT(*) FROM oauth2_provider_refreshtoken WHERE revoked IS NULL").fetchone()[0]
        assert live == 0
    finally:
        server.close()


def test_errors_carry_the_oauth_error_and_never_a_platform_number(make_daemon):
    skip_without("oidc-provider")
    server = PlainProvider("oidc-provider", users=USERS)
    try:
        # django-oidc-provider lists no scopes_supported and refuses a scope its client lacks.
        d, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\nScopes=openid email phone\n")
        d.start()
        refused = login(d, ALICE[0], ALICE[1])
        assert error_name(refused) == "IdentityProviderRefused"
        reason = refused["parameters"]["reason"]
        assert "invalid_scope" in reason and reason.count("refused the request") == 1, reason
        audit = [e["detail"] for e in audit_events(d) if e["action"] == "idp.login"]
        assert "invalid_scope" in audit[-1]
        d.stop()
        # The provider gone: words, not "(-1004)".
        server.kill()
        d2, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\n")
        d2.start()
        gone = login(d2, ALICE[0], ALICE[1])
        assert error_name(gone) == "IdentityProviderUnavailable"
        assert gone["parameters"]["reason"] == "cannot reach the identity provider (connection refused)", gone
        assert "-100" not in json.dumps(audit_events(d2))
    finally:
        server.close()


def test_a_user_recreated_at_dot_does_not_take_over_the_old_person(make_daemon):
    """Deleted and added again with the same email in DOT's admin: a new `sub`. DOT deletes the
    old user's tokens with it, so the next refresh is refused; the new account's login is refused
    too, with what an administrator does, until the old person is removed."""
    skip_without("dot")
    server = PlainProvider("dot", users=USERS, access_seconds=3, refresh_seconds=600)
    try:
        d, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\n")
        d.start()
        who = ok(login(d, ALICE[0], ALICE[1]))["person"]["name"]
        set_passcode(d, who, PASSCODE)
        server.admin("recreate-user", email=ALICE[0], password=ALICE[1])
        wait_until(lambda: person(d, who).get("suspendedReason"), 20, message="the suspension")
        assert person(d, who)["suspendedReason"] == "refresh-token-rejected"
        # The new account: refused, named, audited; nobody created, the old record untouched.
        refused = login(d, ALICE[0], ALICE[1])
        assert error_name(refused) == "SubjectChanged", refused
        assert refused["parameters"]["name"] == who
        assert f"kioskauthctl user remove {who}" in refused["parameters"]["reason"]
        assert [p["name"] for p in ok(d.call("io.kioskauth.ListPeople"))["people"]] == [who]
        assert person(d, who)["suspendedReason"] == "refresh-token-rejected"
        [event] = [e for e in audit_events(d) if e["action"] == "idp.login" and e["result"] == "refused"]
        assert event["person"] == who and event["detail"].startswith("subject-changed: ")
        cli = d.ctl("login", ALICE[0], input=ALICE[1] + "\n")
        assert cli.returncode != 0 and "refused: the identity provider now names alice@example.com" in cli.stderr
        # The refused logins' tokens are revoked at DOT (RFC 7009), not left alive.
        wait_until(lambda: ok(d.call("io.kioskauth.GetConnectivity"))["outboxPending"] == 0, 20, message="delivery")
        import sqlite3

        with sqlite3.connect(server.state_dir / "idp.sqlite3") as db:
            issued, live = db.execute(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE revoked IS NULL) FROM oauth2_provider_refreshtoken").fetchone()
        assert (issued, live) == (2, 0)  # the API's and the CLI's refused logins
        # The administrator removes the old person: the new account signs in as a new person.
        assert d.ctl("user", "remove", who).returncode == 0
        again = ok(login(d, ALICE[0], ALICE[1]))
        assert again["created"] is True and again["person"]["name"] == ALICE[0]
    finally:
        server.close()


def test_a_different_subject_on_refresh_suspends_and_is_audited(make_daemon):
    """django-oidc-provider's administrator switches `sub` from the database id to the username
    (its documented OIDC_IDTOKEN_SUB_GENERATOR): the refresh token stays valid, but the refreshed
    ID token names someone else as far as the terminal can tell."""
    skip_without("oidc-provider")
    server = PlainProvider("oidc-provider", users=USERS, access_seconds=3, refresh_seconds=600)
    try:
        d, _ = make_plain_daemon(make_daemon, server, "DefaultRole=caregiver\n")
        d.start()
        who = ok(login(d, ALICE[0], ALICE[1]))["person"]["name"]
        set_passcode(d, who, PASSCODE)
        server.restart("--sub-generator", "oidc_provider_site.claims.subject_by_username")
        wait_until(lambda: person(d, who).get("suspendedReason"), 20, message="the suspension")
        assert person(d, who)["suspendedReason"] == "subject-changed"
        [event] = [e for e in audit_events(d) if e["action"] == "idp.refresh" and e["result"] == "failure"]
        assert event["person"] == who
        assert f"the refreshed identity has the subject {ALICE[0]}, not " in event["detail"], event
        assert "local unlock suspended, tokens revoked" in event["detail"]
        # Signing in again with the new subject does not take the record over either.
        assert error_name(login(d, ALICE[0], ALICE[1])) == "SubjectChanged"
        assert person(d, who)["suspendedReason"] == "subject-changed"
        assert len(ok(d.call("io.kioskauth.ListPeople"))["people"]) == 1
    finally:
        server.close()


def test_a_client_dot_does_not_know_is_invalid_client_in_the_message_and_the_audit(make_daemon):
    skip_without("dot")
    server = PlainProvider("dot", users=USERS)
    try:
        config = plain_config(server, "DefaultRole=caregiver\n").replace(
            f"ClientID={server.info['client_id']}\n", "ClientID=not-registered-here\n")
        d = make_daemon(config=config)
        d.start()
        refused = login(d, ALICE[0], ALICE[1])
        assert error_name(refused) == "IdentityProviderRefused", refused
        reason = refused["parameters"]["reason"]
        assert "invalid_client" in reason and "HTTP 401" in reason, reason
        [event] = [e for e in audit_events(d) if e["action"] == "idp.login"]
        assert event["result"] == "failure" and "invalid_client" in event["detail"], event
        cli = d.ctl("login", ALICE[0], input=ALICE[1] + "\n")
        assert cli.returncode != 0 and "invalid_client" in cli.stderr, cli.stderr
        assert ALICE[1] not in d.log_text()
    finally:
        server.close()
