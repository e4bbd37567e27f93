"""The PAM conversation of issue #12, end to end, against each unmodified identity provider
(django-oauth-toolkit and django-oidc-provider from PyPI, tests/idp/plain_server.py): the first
login of an unknown email, the fingerprint offer and enrolment in the same conversation; later
three fingers not recognised, the fallback line, the password, signed in; and with the provider
gone, the finger alone within the offline window.

Real libpam (the ctypes pam_start_confdir client), the real daemon, libfprint's virtual reader.
PAM_USER is the email, which is no Unix account (the kiosk-app `kioskauth` service), as in
tests/test_pam_idp.py. Each test starts its own daemon; the tests run as root.
"""

import pytest

from fprint_virtual import environment, scan
from idp_testing import PlainProvider, have_plain_provider, make_plain_daemon
from pam_support import PAM_SUCCESS, Client
from test_pam import TOUCH, NOT_RECOGNISED, audit, call, module, pam, person  # noqa: F401 (fixtures)
from test_pam_activation import ENABLE, ENROLLED, touch_each_stage

ALICE = ("alice@example.com", "alice pw 1", [])
FALLBACK = "Biometric login failed. Please sign in with your email and password."


def password_prompt(email):
    return f"Password for {email}: "


@pytest.fixture(params=["dot", "oidc-provider"])
def provider(request):
    if not have_plain_provider(request.param):
        pytest.skip(f"{request.param} is not installed")
    server = PlainProvider(request.param, users=(ALICE,))
    yield server
    server.close()


def test_first_login_offer_fallback_and_offline_finger(make_daemon, provider, pam):
    d, clock = make_plain_daemon(make_daemon, provider, "DefaultRole=caregiver\nOfflineWindowSec=3600\n",
                                 fingerprints=True)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device_storage", sensor, base={}))
    d.start()
    [reader] = call(d, "GetReaders")["parameters"]["readers"]
    n = reader["enrollStages"]
    pam.kioskauth("kioskauth", d.socket)
    email, password, _ = ALICE

    # First login of an email this terminal does not know: the password, then the offer.
    c = Client(pam, "kioskauth", email, "authenticate", "acct_mgmt")
    c.expect_message(password_prompt(email))
    c.send(password)
    c.expect_message(ENABLE)
    c.send("y")
    touch_each_stage(c, sensor, "alice-finger", n)
    results = c.results()
    print("\n".join(c.transcript_lines()))
    assert c.messages() == [
        ("prompt_echo_off", password_prompt(email)),
        ("info", "Welcome, Alice"),
        ("prompt_echo_on", ENABLE),
        *[("info", f"Touch the reader (stage {i} of {n})…") for i in range(1, n + 1)],
        ("info", ENROLLED),
    ]
    role = {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Alice"}
    assert [(r["rc"], r["user"], r["env"]) for r in results] == [(PAM_SUCCESS, email, role)] * 2
    alice = person(d, email)
    assert (alice["origin"], alice["roles"], alice["fingers"], alice["hasPasscode"]) == (
        "idp", ["caregiver"], ["right-index"], False)
    [created] = audit(d, "idp.login")
    assert (created["result"], created["method"], created["service"]) == ("success", "idp-password", "kioskauth")
    assert created["detail"].startswith("created; roles=caregiver (from DefaultRole)")
    assert [(e["person"], e["result"]) for e in audit(d, "finger.enroll")] == [(email, "success")]

    # Later: three fingers not recognised, exactly the fallback line, the password, signed in.
    c = Client(pam, "kioskauth", email, "authenticate", "acct_mgmt")
    for _ in range(3):
        c.expect(TOUCH)
        scan(sensor, "someone-else")
        c.expect_message(NOT_RECOGNISED)
    c.expect_message(password_prompt(email))
    c.send(password)
    results = c.results()
    print("\n".join(c.transcript_lines()))
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 3 + [
        ("error", FALLBACK), ("prompt_echo_off", password_prompt(email)), ("info", "Welcome back, Alice")]
    assert [(r["rc"], r["user"], r["env"]) for r in results] == [(PAM_SUCCESS, email, role)] * 2
    assert [e["result"] for e in audit(d, "idp.login")] == ["success", "success"]
    assert password not in d.log_text()

    # The provider gone: within the offline window (half of it spent), her finger alone.
    provider.kill()
    clock.advance(1800)
    for user in (email, None):  # by name, and walk-up
        c = Client(pam, "kioskauth", user, "authenticate")
        c.expect(TOUCH)
        scan(sensor, "alice-finger")
        [result] = c.results()
        assert (result["rc"], result["user"]) == (PAM_SUCCESS, email), c.transcript
        # Walk-up, the reader said who it was; by name, the application already knows.
        welcome = [("info", "Welcome back, Alice")] if user is None else []
        assert c.messages() == [("info", TOUCH), *welcome], c.transcript
    assert person(d, email)["state"] == "active"
