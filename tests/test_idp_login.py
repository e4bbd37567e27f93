"""Online login with the identity provider: the real kioskauthd against the real
django-oauth-toolkit server (tests/idp/server.py) on loopback.

Token validation itself (tampered, expired, wrong-audience, wrong-issuer tokens) is covered by
Tests/KioskAuthIdentityTests/TokenValidatorTests.swift and IdentityProviderIntegrationTests.swift;
these tests cover what the daemon makes of a login.
"""

import sqlite3
import threading
import time

import pytest

from fprint_virtual import environment
from kioskauth_testing import ensure_group, read_message, send_message
from idp_testing import (
    SARAH, Connection, IdentityServer, audit_events, enroll_with_ticket, error_name, have_identity_server, login,
    make_identity_daemon, ok, person, set_passcode,
)

pytestmark = pytest.mark.skipif(not have_identity_server(), reason="django-oauth-toolkit is not installed")


NOOR = ("noor@clinic.example", "pw-noor", "coordinator", "nurses")
EVE = ("eve@elsewhere.example", "pw-eve", "caregiver", "nurses")
ROLF = ("rolf@clinic.example", "pw-rolf", "janitor", "nurses")
NOROLE = ("nina@clinic.example", "pw-nina", "", "nurses")


@pytest.fixture(scope="module")
def idp():
    server = IdentityServer(access_seconds=300, users=(SARAH, NOOR, EVE, ROLF, NOROLE))
    yield server
    server.close()


def test_first_login_creates_the_person_and_a_wrong_password_is_refused(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    wrong = login(d, password="not the password")
    assert error_name(wrong) == "WrongCredentials"
    assert ok(d.call("io.kioskauth.ListPeople"))["people"] == []

    reply = ok(login(d))
    assert reply["created"] is True
    p = reply["person"]
    assert (p["name"], p["displayName"], p["origin"], p["state"], p["roles"], p["email"]) == (
        "sarah@clinic.example", "Sarah", "idp", "active", ["caregiver"], "sarah@clinic.example")
    assert reply["offerFingerprint"] is False  # no reader on this daemon
    assert reply["ticket"] and reply["ticketExpiresIn"] > 0

    # A second login finds the same person by the provider's subject.
    again = ok(login(d))
    assert again["created"] is False and again["person"]["name"] == p["name"]

    # The refresh token is sealed in the store, never in the clear.
    with sqlite3.connect(d.state / "kioskauth.sqlite") as db:
        (sealed,) = db.execute("SELECT sealed FROM secrets WHERE kind = 'refresh-token'").fetchone()
    assert len(sealed) > 40
    actions = [(e["action"], e["result"]) for e in audit_events(d)]
    assert ("idp.login", "failure") in actions and actions.count(("idp.login", "success")) == 2
    assert "not the password" not in d.log_text() and "correct horse" not in d.log_text()


def test_people_outside_the_allow_list_and_unknown_roles_are_refused(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    outsider = login(d, EVE[0], EVE[1])
    assert error_name(outsider) == "NotAdmitted"
    assert "elsewhere.example" in outsider["parameters"]["reason"]
    janitor = login(d, ROLF[0], ROLF[1])
    assert error_name(janitor) == "UnknownRole"
    assert "janitor" in janitor["parameters"]["reason"]
    nobody = login(d, NOROLE[0], NOROLE[1])
    assert error_name(nobody) == "UnknownRole"
    assert ok(d.call("io.kioskauth.ListPeople"))["people"] == []
    # The coordinator is admitted with the role from the claim.
    assert ok(login(d, NOOR[0], NOOR[1]))["person"]["roles"] == ["coordinator"]


def test_a_required_group_admits_only_its_members(make_daemon):
    server = IdentityServer(users=(SARAH, ("omar@clinic.example", "pw-omar", "caregiver", "porters")))
    try:
        d, _ = make_identity_daemon(make_daemon, server, "RequiredGroup=nurses\n")
        d.start()
        assert ok(login(d))["person"]["name"] == SARAH[0]
        refused = login(d, "omar@clinic.example", "pw-omar")
        assert error_name(refused) == "NotAdmitted" and "nurses" in refused["parameters"]["reason"]
    finally:
        server.close()


def test_login_needs_an_authenticator(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    reply = d.call("io.kioskauth.LoginWithPassword", {"email": SARAH[0], "password": SARAH[1]}, user="nobody")
    assert error_name(reply) == "PermissionDenied"


def test_an_online_login_clears_a_passcode_hard_lock(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp, "\n[Passcode]\nLockoutDelaysSec=0\nHardLockAfter=3\n")
    d.start()
    name = ok(login(d))["person"]["name"]
    set_passcode(d, name)
    for _ in range(3):
        d.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": "000001"})
    locked = d.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": "482913"})
    assert error_name(locked) == "PasscodeLocked" and locked["parameters"]["hardLocked"] is True
    ok(login(d))
    assert person(d, name)["passcodeHardLocked"] is False
    ok(d.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": "482913"}))


def test_biometric_offer_is_made_once_and_a_decline_is_remembered(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp, fingerprints=True)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device_storage", sensor, base={}))
    d.start()
    conn = Connection(d.socket)
    first = ok(login(d, conn=conn))
    assert first["offerFingerprint"] is True
    name = first["person"]["name"]

    # The kiosk app declines on the person's behalf with the login's ticket.
    declined = ok(conn.call("SetBiometricOffer", {"name": name, "enabled": False, "ticket": first["ticket"]}))
    assert declined["person"]["biometricOffer"] is False
    assert ok(login(d, conn=conn))["offerFingerprint"] is False
    # A kiosk app (kioskauth group, not admin) needs a live ticket of this person: the used one is gone.
    ensure_group("kioskauth")
    refused = d.call("io.kioskauth.SetBiometricOffer", {"name": name, "enabled": True, "ticket": first["ticket"]},
                     user="nobody", groups=["kioskauth"])
    assert error_name(refused) == "PermissionDenied"
    # Still declined after a restart: it is stored.
    conn.close()
    d.restart()
    conn = Connection(d.socket)
    assert ok(login(d, conn=conn))["offerFingerprint"] is False

    r = d.ctl("user", "set", name, "--biometric-offer", "on")
    assert r.returncode == 0, r.stderr
    offered = ok(login(d, conn=conn))
    assert offered["offerFingerprint"] is True

    # Accepting: the app enrols the finger with the login's ticket on the same connection.
    reply = enroll_with_ticket(conn, sensor, name, offered["ticket"], "sarah-right-index")
    assert "error" not in reply, reply
    assert reply["parameters"]["person"]["fingers"] == ["right-index"]
    # Someone with a finger is not offered enrolment again.
    assert ok(login(d, conn=conn))["offerFingerprint"] is False
    conn.close()


def test_device_login_streams_the_code_then_the_person(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    conn = Connection(d.socket, timeout=60)
    # Without "more" the call is refused with the standard varlink error.
    send_message(conn.sock, {"method": "io.kioskauth.StartDeviceLogin", "parameters": {}})
    assert read_message(conn.sock)["error"] == "org.varlink.service.ExpectedMore"

    send_message(conn.sock, {"method": "io.kioskauth.StartDeviceLogin", "parameters": {}, "more": True})
    first = read_message(conn.sock)
    assert first.get("continues") is True, first
    prompt = first["parameters"]["prompt"]
    assert prompt["userCode"] and prompt["verificationUri"].startswith(idp.issuer)
    idp.control("approve-device", {"user_code": prompt["userCode"], "email": NOOR[0]})
    final = read_message(conn.sock)
    assert "error" not in final, final
    assert final["parameters"]["person"]["name"] == NOOR[0]
    assert final["parameters"]["person"]["roles"] == ["coordinator"]
    assert not final.get("continues")

    # A denied device login is a named error.
    send_message(conn.sock, {"method": "io.kioskauth.StartDeviceLogin", "parameters": {}, "more": True})
    prompt = read_message(conn.sock)["parameters"]["prompt"]
    idp.control("approve-device", {"user_code": prompt["userCode"], "email": NOOR[0], "deny": True})
    assert error_name(read_message(conn.sock)) == "DeviceLoginDenied"
    conn.close()


def test_without_an_identity_provider_login_is_a_named_error(daemon):
    reply = daemon.call("io.kioskauth.LoginWithPassword", {"email": SARAH[0], "password": SARAH[1]})
    assert error_name(reply) == "IdentityProviderNotConfigured"
    assert ok(daemon.call("io.kioskauth.GetConnectivity"))["identityProvider"] is False


def test_a_configuration_that_admits_nobody_does_not_start(make_daemon, idp):
    d, _ = make_identity_daemon(make_daemon, idp)
    d.config_path.write_text(d.config_path.read_text().replace("AllowedEmailDomains=clinic.example", ""))
    d.start(expect_ready=False)
    assert d.wait_exit(30) == 78
    assert "admits nobody" in d.log_text()


def test_an_idp_answering_byte_by_byte_times_out_as_a_whole_and_unlock_never_waits(make_daemon, idp):
    """The token endpoint processes the login, then sends its answer a byte every 0.1 s: never
    silent for the 2 s RequestTimeoutSec, done only after minutes. The request timeout is for
    the whole exchange, so the login ends as unavailable after about 2 s; unlocks meanwhile are
    answered at once."""
    d, _ = make_identity_daemon(make_daemon, idp)
    d.start()
    name = ok(login(d))["person"]["name"]
    set_passcode(d, name, "482913")
    idp.control("fault", {"kind": "drip", "interval": 0.1, "count": 1})
    result = {}

    def slow_login():
        started = time.monotonic()
        result["reply"] = login(d)
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=slow_login)
    thread.start()
    unlock = Connection(d.socket)
    unlocks = []
    time.sleep(0.3)
    while thread.is_alive() and len(unlocks) < 200:
        started = time.monotonic()
        ok(unlock.call("VerifyPasscode", {"name": name, "passcode": "482913"}))
        unlocks.append(time.monotonic() - started)
        time.sleep(0.1)
    thread.join(60)
    unlock.close()
    assert error_name(result["reply"]) == "IdentityProviderUnavailable", result
    assert result["seconds"] < 2 + 3, result
    assert unlocks and max(unlocks) < 1.0, unlocks
    # The next login, answered normally, is served.
    assert ok(login(d))["person"]["name"] == name
