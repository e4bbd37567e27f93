"""First use at the terminal through pam_kioskauth.so: activation code, passcode, fingerprint
offer, closing message, and the role variables applications read, all in one PAM conversation.

Real libpam (the ctypes pam_start_confdir client, and pamtester under pam_wrapper), the real
daemon, and libfprint's virtual readers. Each test starts its own daemon. Codes come from
AddPerson, as `kioskauthctl user add` prints them.
"""

import tempfile
import time
from pathlib import Path

from fprint_virtual import VirtualDevice, scan
from kioskauth_testing import as_user, ensure_group
from pam_support import (MODULE, PAM_AUTH_ERR, PAM_AUTHINFO_UNAVAIL, PAM_MAXTRIES, PAM_PERM_DENIED, PAM_SUCCESS, Client,
                         PamConfig, enroll, run_pamtester, security_dir)
from test_pam import TOUCH, audit, call, module, pam, person, start  # noqa: F401 (fixtures)

GOOD = "482913"
WEAK = "123456"
ROLES = """
[Roles]
Caregiver=You can unlock this terminal, see today's visits and record care notes.
Coordinator=You can plan visits and manage the team's schedule.
[Access]
# The test stacks "activate" and "activate-6" are kiosk services like "kioskauth": activation
# sets a passcode, so they must be on the passcode allow-list.
PasscodeServices=kioskauth lightdm greetd activate activate-6
"""
CAREGIVER_CAN = "You can unlock this terminal, see today's visits and record care notes."
COORDINATOR_CAN = "You can plan visits and manage the team's schedule."

OFFER = "Enter your activation code, or press Enter to skip: "
CODE_PROMPT = "Activation code: "
CHOOSE = "Choose a passcode (6 digits): "
CONFIRM = "Type the same passcode again: "
ENABLE = "Enable fingerprint login? [y/N] "
NOT_SET_UP = "Your account is not set up yet. Enter the activation code you were given."
ENROLLED = "Finger enrolled. Next time, just touch the reader."
LATER = "You can turn on fingerprint login later: ask your coordinator."
DUPLICATE_CHECK = "Touch the reader to check this finger is not already enrolled…"
# The daemon's own messages.
WRONG = "That code is not right. Check it and try again."
EXPIRED = "This code has expired. Ask your coordinator for a new code."
USED = "This code has already been used. If you have not activated yet, ask your coordinator for a new code."
REVOKED = "This code no longer works. Ask your coordinator for a new code."
PAUSED = "Too many wrong codes on this terminal. Wait a few minutes, or ask your coordinator."
NOT_ACTIVATED = "Your account is not activated yet: enter your activation code first."


def provision(d, name, display, roles=("caregiver",)):
    """An admin adds a person pending activation; returns the one-time code."""
    r = call(d, "AddPerson", {"name": name, "displayName": display, "roles": list(roles)})
    assert "error" not in r, r
    assert r["parameters"]["person"]["state"] == "pending_activation"
    return r["parameters"]["activationCode"]


def add_active(d, name, display, roles=("caregiver",), passcode=GOOD):
    provision(d, name, display, roles)
    assert "error" not in call(d, "SetPasscode", {"name": name, "passcode": passcode, "confirmation": passcode})


def weak_message(d, name):
    """What the daemon says about WEAK (asked about an active person, whom it leaves alone)."""
    r = call(d, "SetPasscode", {"name": name, "passcode": WEAK, "confirmation": WEAK})
    assert r["error"] == "io.kioskauth.WeakPasscode", r
    return r["parameters"]["message"]


def stages(d):
    [reader] = call(d, "GetReaders")["parameters"]["readers"]
    return reader["enrollStages"]


def stage_prompts(n):
    return [("info", f"Touch the reader (stage {i} of {n})…") for i in range(1, n + 1)]


def touch_each_stage(c, sensor, finger, n):
    for i in range(1, n + 1):
        c.expect_message(f"Touch the reader (stage {i} of {n})…")
        scan(sensor, finger)


def env_of(result):
    return result["env"]


# The whole first use ------------------------------------------------------------------------------


def test_first_use_in_one_conversation_code_passcode_finger_welcome_role(make_daemon, pam):
    """A greeter's keyboard conversation with the activation option, on a terminal where a
    colleague is already enrolled (so the new finger is first checked against the roster)."""
    d, sensor = start(make_daemon, "virtual_device_storage", ROLES)
    add_active(d, "omar", "Omar")
    enroll(d, sensor, "omar", "omar-finger")
    code = provision(d, "sarah", "Sarah Lee")
    weak = weak_message(d, "omar")
    n = stages(d)
    pam.kioskauth("lightdm", d.socket, "mode=passcode activation")

    c = Client(pam, "lightdm", None, "authenticate", "acct_mgmt")
    c.expect_message(OFFER)
    c.send(code.lower().replace("-", ""))  # typed as it sounds: lower case, no hyphen
    c.expect_message(CHOOSE)
    c.send(WEAK)
    c.send(WEAK)
    c.expect_message(weak)
    c.send(GOOD)
    c.send(GOOD)
    c.expect_message(ENABLE)
    c.send("y")
    c.expect_message(DUPLICATE_CHECK)
    scan(sensor, "sarah-finger")
    touch_each_stage(c, sensor, "sarah-finger", n)
    results = c.results()
    print("\n".join(c.transcript_lines()))

    assert c.messages() == [
        ("prompt_echo_on", OFFER),
        ("info", "Code accepted. Hello, Sarah Lee."),
        ("prompt_echo_off", CHOOSE), ("prompt_echo_off", CONFIRM),
        ("error", weak),
        ("prompt_echo_off", CHOOSE), ("prompt_echo_off", CONFIRM),
        ("prompt_echo_on", ENABLE),
        ("info", DUPLICATE_CHECK),
        *stage_prompts(n),
        ("info", ENROLLED),
        ("info", "You're all set, Sarah. Your role: caregiver."),
        ("info", CAREGIVER_CAN),
    ]
    role = {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Sarah Lee"}
    assert [(r["op"], r["rc"], r["user"], r["env"]) for r in results] == [
        ("authenticate", PAM_SUCCESS, "sarah", role), ("acct_mgmt", PAM_SUCCESS, "sarah", role)]
    sarah = person(d, "sarah")
    assert sarah["state"] == "active" and sarah["hasPasscode"] and sarah["fingers"] == ["right-index"]
    checks = audit(d, "activation.check")
    assert [e["result"] for e in checks] == ["success"] and checks[0]["service"] == "lightdm"
    assert [e["result"] for e in audit(d, "activation.complete")] == ["refused", "success"]  # weak, then good
    assert [e["person"] for e in audit(d, "finger.enroll") if e["result"] == "success"] == ["omar", "sarah"]

    # The next morning: touch to unlock, the role again for the app.
    pam.kioskauth("kioskauth", d.socket)
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]) == (PAM_SUCCESS, "sarah", role)
    assert c.messages() == [("info", TOUCH), ("info", "Welcome back, Sarah Lee")]
    # The passcode she chose works; the code is spent.
    assert run_pamtester(pam, "lightdm", "sarah", "authenticate", answers=[("Passcode: ", GOOD)]).result() == 0
    assert call(d, "CheckActivationCode", {"code": code})["error"] == "io.kioskauth.ActivationCodeUsed"


def test_a_newcomer_who_types_their_name_is_asked_for_the_code_and_may_decline_the_finger(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device", ROLES)
    code = provision(d, "sarah", "Sarah Lee", roles=("coordinator", "caregiver"))
    pam.kioskauth("kioskauth", d.socket)

    c = Client(pam, "kioskauth", "sarah", "authenticate", "acct_mgmt")
    for line in ("ABCD-EFGH", code, GOOD, GOOD, "n"):
        c.send(line)
    results = c.results()
    assert c.messages() == [
        ("info", NOT_SET_UP),
        ("prompt_echo_on", CODE_PROMPT),
        ("error", WRONG),
        ("prompt_echo_on", CODE_PROMPT),
        ("info", "Code accepted. Hello, Sarah Lee."),
        ("prompt_echo_off", CHOOSE), ("prompt_echo_off", CONFIRM),
        ("prompt_echo_on", ENABLE),
        ("info", LATER),
        ("info", "You're all set, Sarah. Your role: coordinator and more."),
        ("info", COORDINATOR_CAN),
    ]
    role = {"KIOSKAUTH_ROLE": "coordinator", "KIOSKAUTH_DISPLAY_NAME": "Sarah Lee"}
    assert [(r["rc"], r["user"], r["env"]) for r in results] == [(0, "sarah", role), (0, "sarah", role)]
    # Declined: no finger, no enrolment attempted, still logged in (above) — and remembered.
    assert person(d, "sarah")["fingers"] == [] and audit(d, "finger.enroll") == []
    assert person(d, "sarah")["biometricOffer"] is False
    assert [e["detail"] for e in audit(d, "person.biometric-offer")] == ["declined"]
    # The offer comes with activation, which happens once: the next login is the passcode, and
    # nothing asks about fingerprints again.
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", answers=[("Passcode: ", GOOD)])
    assert p.result() == PAM_SUCCESS
    assert "fingerprint" not in p.transcript.lower() and TOUCH not in p.out


def test_an_enrolment_that_does_not_finish_still_logs_the_person_in(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device", ROLES)
    code = provision(d, "sarah", "Sarah Lee")
    n = stages(d)
    pam.kioskauth("kioskauth", d.socket, "mode=activate")
    c = Client(pam, "kioskauth", None, "authenticate")
    for line in (code, GOOD, GOOD, "y"):
        c.send(line)
    c.expect_message(f"Touch the reader (stage 1 of {n})…")
    scan(sensor, "sarah-finger")
    c.expect_message(f"Touch the reader (stage 2 of {n})…")
    VirtualDevice(sensor).unplug()
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, "sarah")
    assert c.messages()[-5:] == [
        ("info", f"Touch the reader (stage 2 of {n})…"), ("error", "The finger could not be enrolled."),
        ("info", LATER), ("info", "You're all set, Sarah. Your role: caregiver."), ("info", CAREGIVER_CAN)]
    assert person(d, "sarah")["fingers"] == [] and person(d, "sarah")["state"] == "active"
    [event] = audit(d, "finger.enroll")
    assert event["result"] == "failure" and event["detail"] == "right-index: io.kioskauth.ReaderRemoved"


def test_walk_up_offers_the_code_after_identify_gives_up_and_enter_skips_to_the_name(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage", ROLES)
    add_active(d, "omar", "Omar")
    enroll(d, sensor, "omar", "omar-finger")
    code = provision(d, "sarah", "Sarah Lee")
    pam.kioskauth("kioskauth", d.socket, "activation max_tries=1")

    # Someone who has activated: Enter skips the offer.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "omar-other-finger")
    c.expect_message(OFFER)
    c.send("")
    c.expect_message("Name: ")
    c.send("omar")
    # The finger is done with (out of tries): after the name comes the passcode, not another touch.
    c.expect_message("Passcode: ")
    c.send(GOOD)
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, "omar")
    assert c.messages() == [("info", TOUCH), ("error", "Fingerprint not recognised."),
                            ("error", "Too many tries with the finger: use your name and passcode."),
                            ("prompt_echo_on", OFFER), ("prompt_echo_on", "Name: "),
                            ("prompt_echo_off", "Passcode: ")]

    # The newcomer: touch, not recognised, the code.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    c.expect_message(OFFER)
    for line in (code, GOOD, GOOD, "no"):
        c.send(line)
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]["KIOSKAUTH_ROLE"]) == (PAM_SUCCESS, "sarah", "caregiver")
    assert ("info", LATER) in c.messages()

    # A finger-only conversation has no keyboard: a pending person is told, not asked.
    provision(d, "lena", "Lena")
    pam.kioskauth("finger", d.socket, "mode=identify")
    c = Client(pam, "finger", "lena", "authenticate")
    [result] = c.results()
    assert result["rc"] == PAM_AUTH_ERR
    assert c.messages() == [("error", "Your account is not activated yet.")]


# Codes that do not work -----------------------------------------------------------------------------


def test_wrong_used_and_replaced_codes_each_say_what_happened(make_daemon, pam):
    d, _ = start(make_daemon, None, ROLES + "\n[Activation]\nTerminalMaxFailures=100\n")
    code = provision(d, "sarah", "Sarah Lee")
    pam.kioskauth("activate", d.socket, "mode=activate")

    # Wrong, then right; no reader, so no fingerprint offer.
    c = Client(pam, "activate", None, "authenticate")
    pasted = f"  {code[:4].lower()} {code[5:]} "  # spaces around and inside, as pasted from a message
    for line in ("abcd-efgh", pasted, GOOD, GOOD):
        c.send(line)
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]) == (
        PAM_SUCCESS, "sarah", {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Sarah Lee"})
    assert c.messages() == [
        ("prompt_echo_on", CODE_PROMPT), ("error", WRONG),
        ("prompt_echo_on", CODE_PROMPT), ("info", "Code accepted. Hello, Sarah Lee."),
        ("prompt_echo_off", CHOOSE), ("prompt_echo_off", CONFIRM),
        ("info", "You're all set, Sarah. Your role: caregiver."), ("info", CAREGIVER_CAN)]

    # Used: its own message; Enter at the next prompt gives up, and nobody is logged in.
    c = Client(pam, "activate", None, "authenticate")
    for line in (code, ""):
        c.send(line)
    [result] = c.results()
    assert (result["rc"], result["user"], result["env"]) == (PAM_AUTH_ERR, None, {})
    assert c.messages() == [("prompt_echo_on", CODE_PROMPT), ("error", USED), ("prompt_echo_on", CODE_PROMPT)]

    # Replaced by a new code: the old one says so; the new one works in the same conversation.
    old = provision(d, "omar", "Omar")
    new = call(d, "IssueActivationCode", {"name": "omar"})["parameters"]["code"]
    p = run_pamtester(pam, "activate", "omar", "authenticate",
                      answers=[(CODE_PROMPT, old), (CODE_PROMPT, new), (CHOOSE, GOOD), (CONFIRM, GOOD)])
    assert p.result() == PAM_SUCCESS
    assert p.err.startswith(f"{CODE_PROMPT}{REVOKED}\n{CODE_PROMPT}")
    assert "You're all set, Omar. Your role: caregiver.\n" in p.out

    # A person's code dies after five wrong tries; the right one then no longer works either.
    code = provision(d, "lena", "Lena")
    pam.kioskauth("activate-6", d.socket, "mode=activate max_tries=6")
    p = run_pamtester(pam, "activate-6", "lena", "authenticate",
                      answers=[(CODE_PROMPT, "ZZZZ-ZZZZ")] * 5 + [(CODE_PROMPT, code)])
    assert p.result() == PAM_MAXTRIES
    assert p.err.count(WRONG + "\n") == 5 and p.err.count(REVOKED + "\n") == 1
    assert CHOOSE not in p.err
    assert person(d, "lena")["state"] == "pending_activation"


def test_an_expired_code_says_to_ask_for_a_new_one(make_daemon, pam):
    d, _ = start(make_daemon, None, "\n[Activation]\nCodeLifetimeSec=1\n")
    code = provision(d, "sarah", "Sarah Lee")
    time.sleep(1.5)
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", answers=[(CODE_PROMPT, code), (CODE_PROMPT, "")])
    assert p.result() == PAM_AUTH_ERR
    assert f"{CODE_PROMPT}{EXPIRED}\n{CODE_PROMPT}" in p.err
    assert NOT_SET_UP + "\n" in p.out
    assert person(d, "sarah")["state"] == "pending_activation"
    [event] = audit(d, "activation.check")
    assert event["result"] == "failure" and event["detail"] == "expired code"


def test_five_wrong_codes_on_a_terminal_pause_activation(make_daemon, pam):
    d, _ = start(make_daemon, None, ROLES)
    code = provision(d, "sarah", "Sarah Lee")
    pam.kioskauth("activate", d.socket, "mode=activate max_tries=6")
    c = Client(pam, "activate", None, "authenticate")
    for line in ["ZZZZ-ZZZZ"] * 5 + [code]:
        c.send(line)
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_MAXTRIES, None)
    assert c.messages() == [("prompt_echo_on", CODE_PROMPT), ("error", WRONG)] * 5 + [
        ("prompt_echo_on", CODE_PROMPT), ("error", PAUSED)]
    # The next person at this terminal is told at once, even with the right code.
    c = Client(pam, "activate", None, "authenticate")
    c.send(code)
    [result] = c.results()
    assert result["rc"] == PAM_MAXTRIES
    assert c.messages() == [("prompt_echo_on", CODE_PROMPT), ("error", PAUSED)]
    assert person(d, "sarah")["state"] == "pending_activation"
    assert [e["result"] for e in audit(d, "activation.check")] == ["failure"] * 5 + ["refused"] * 2


# account, remote sessions, the environment -------------------------------------------------------


def test_account_refuses_a_pending_person_with_the_reason(make_daemon, pam):
    d, _ = start(make_daemon)
    provision(d, "sarah", "Sarah Lee")
    pam.kioskauth("kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", "sarah", "acct_mgmt")
    assert p.result() == PAM_PERM_DENIED
    assert p.err.splitlines()[0] == NOT_ACTIVATED
    # Whoever authenticated (here pam_permit): the account step still refuses.
    pam.add("other-auth", f"auth required {security_dir() / 'pam_permit.so'}\n"
                          f"account required {MODULE} socket={d.socket}\n")
    c = Client(pam, "other-auth", "sarah", "authenticate", "acct_mgmt")
    assert [(r["op"], r["rc"]) for r in c.results()] == [("authenticate", 0), ("acct_mgmt", PAM_PERM_DENIED)]
    assert c.messages() == [("error", NOT_ACTIVATED)]
    [event] = [e for e in audit(d, "account.check") if e["service"] == "other-auth"]
    assert event["result"] == "refused"


def test_no_activation_over_a_remote_session(make_daemon, pam):
    d, _ = start(make_daemon)
    provision(d, "sarah", "Sarah Lee")
    pam.kioskauth("activate", d.socket, "mode=activate")
    c = Client(pam, "activate", None, "authenticate", items={"rhost": "laptop.example.org"})
    [result] = c.results()
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL and c.messages() == []
    # With the option: no offer, and a pending person who gives their name is not asked for a code.
    pam.kioskauth("kioskauth", d.socket, "mode=passcode activation")
    c = Client(pam, "kioskauth", None, "authenticate", items={"rhost": "laptop.example.org"})
    c.send("sarah")
    [result] = c.results()
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL
    assert c.messages() == [("prompt_echo_on", "Name: ")]
    assert audit(d, "activation.check") == []


def test_role_variables_follow_every_kind_of_auth_and_go_with_a_failure(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage")
    add_active(d, "sarah", "Sarah Lee")
    # An escape sequence or a tab in a display name is refused when the admin types it ...
    refused = call(d, "AddPerson", {"name": "omar", "displayName": "Omar\x1b[31m O'Neill\t"})
    assert refused["error"] == "io.kioskauth.InvalidInput" and refused["parameters"]["field"] == "displayName"
    # ... more bytes than the environment takes (each euro sign is three) are not.
    messy = "Omar O'Neill " + "€" * 100
    add_active(d, "omar", messy, roles=("coordinator", "family"))
    enroll(d, sensor, "sarah", "sarah-finger")
    enroll(d, sensor, "omar", "omar-finger")
    sarah = {"KIOSKAUTH_ROLE": "caregiver", "KIOSKAUTH_DISPLAY_NAME": "Sarah Lee"}
    clean = "Omar O'Neill " + "€" * 81  # 13 + 3 * 81 = 256 bytes: whole characters, at most 256
    omar = {"KIOSKAUTH_ROLE": "coordinator", "KIOSKAUTH_DISPLAY_NAME": clean}
    pam.kioskauth("kioskauth", d.socket)

    # Walk-up identify.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    scan(sensor, "omar-finger")
    [result] = c.results()
    assert (result["user"], result["env"]) == ("omar", omar)
    assert "\x1b" not in c.messages()[-1][1]  # the welcome line is cleaned too
    # Verify.
    c = Client(pam, "kioskauth", "sarah", "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert [r["env"] for r in c.results()] == [sarah]
    # Passcode; then a second attempt on the same handle fails and takes the variables with it.
    pam.kioskauth("login", d.socket, "mode=passcode max_tries=1")
    c = Client(pam, "login", "sarah", "authenticate", "authenticate")
    for line in (GOOD, "111111"):
        c.send(line)
    assert [(r["rc"], r["env"]) for r in c.results()] == [(PAM_SUCCESS, sarah), (PAM_MAXTRIES, {})]


# A kiosk app that is not root -----------------------------------------------------------------------


def test_a_kiosk_app_in_the_kioskauth_group_activates_and_enrols_with_tickets_even_typing_slowly(make_daemon, module):
    """Not root, so not an admin: enrolment needs the ticket activation returned on the same
    connection. The daemon closes idle connections after 1 s here and the person pauses longer
    before the passcode and before answering the offer: the module fetches fresh tickets (the
    code again, then the new passcode) instead of failing."""
    d, sensor = start(make_daemon, "virtual_device_storage", "\n[Socket]\nIdleTimeoutSec=1\n")
    code = provision(d, "sarah", "Sarah Lee")
    n = stages(d)
    ensure_group("kioskauth")
    shared = Path(tempfile.mkdtemp(prefix="kioskauth-pam-"))
    shared.chmod(0o755)
    pam = PamConfig(shared)
    pam.kioskauth("kioskauth", d.socket, "mode=activate")

    c = Client(pam, "kioskauth", None, "authenticate", run_as=as_user([], "nobody", ["kioskauth"]),
               python="/usr/bin/python3")
    c.expect_message(CODE_PROMPT)
    c.send(code)
    c.expect_message(CHOOSE)
    time.sleep(1.5)
    c.send(GOOD)
    c.send(GOOD)
    c.expect_message(ENABLE)
    time.sleep(1.5)
    c.send("y")
    touch_each_stage(c, sensor, "sarah-finger", n)
    [result] = c.results()
    assert (result["rc"], result["user"]) == (PAM_SUCCESS, "sarah"), c.transcript
    assert ("info", ENROLLED) in c.messages()
    assert person(d, "sarah")["fingers"] == ["right-index"]
    events = [e for e in call(d, "GetAudit", {})["parameters"]["events"]
              if e["action"] in ("activation.check", "activation.complete", "passcode.verify", "finger.enroll")]
    assert [(e["action"], e["result"], e["callerUid"]) for e in events] == [
        ("activation.check", "success", 65534), ("activation.check", "success", 65534),
        ("activation.complete", "success", 65534), ("passcode.verify", "success", 65534),
        ("finger.enroll", "success", 65534)]

    # The same app, everyday: a passcode; and a pending person found by name (the app may not
    # read people, so CheckAccount tells it) is asked for their code instead.
    provision(d, "lena", "Lena")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    for name, answer, expected in (("sarah", GOOD, [("prompt_echo_off", "Passcode: ")]),
                                   ("lena", "", [("info", NOT_SET_UP), ("prompt_echo_on", CODE_PROMPT)])):
        c = Client(pam, "kioskauth", name, "authenticate", run_as=as_user([], "nobody", ["kioskauth"]),
                   python="/usr/bin/python3")
        c.send(answer)
        [result] = c.results()
        assert result["rc"] == (PAM_SUCCESS if name == "sarah" else PAM_AUTH_ERR)
        assert c.messages() == expected
    assert [e["action"] for e in audit(d, "person.show")] == []  # nothing refused on the way


def test_activation_is_refused_from_su_like_and_unlisted_services(make_daemon, pam):
    d, _ = start(make_daemon, None, ROLES)
    code = provision(d, "sarah", "Sarah Lee")
    for service in ("su", "sudo", "cron"):
        reply = call(d, "CheckActivationCode", {"code": code, "context": {"service": service, "ruid": 65534}})
        assert reply["error"] == "io.kioskauth.PasscodeNotAllowed", (service, reply)
    # Nothing counted against the code or the terminal: it still works.
    assert call(d, "CheckActivationCode", {"code": code, "context": {"service": "kioskauth"}})["parameters"]["person"]["name"] == "sarah"
