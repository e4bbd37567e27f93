"""Pre-provisioned people and one-time activation codes, through the real daemon."""

import json
import re
import time

import pytest

from kioskauth_testing import FAST_HASH_CONFIG, connect, read_message, send_message

CODE = re.compile(r"activation code: ([0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4})")


def add(d, name, *extra):
    r = d.ctl("user", "add", name, *extra)
    assert r.returncode == 0, r.stderr
    return CODE.search(r.stdout).group(1)


class Terminal:
    """One connection, as a kiosk app or the PAM module keeps it through an activation."""

    def __init__(self, d):
        self.s = connect(d.socket)

    def call(self, method, **parameters):
        send_message(self.s, {"method": "io.kioskauth." + method, "parameters": parameters})
        return read_message(self.s)


def test_user_add_prints_a_code_and_the_person_waits_for_activation(daemon):
    code = add(daemon, "sarah", "--display-name", "Sarah Lee", "--role", "caregiver")
    person = json.loads(daemon.ctl("user", "show", "sarah", "--json").stdout)["person"]
    assert person["state"] == "pending_activation"
    # The store keeps only an HMAC of the code.
    import sqlite3
    raw = (daemon.state / "kioskauth.sqlite").read_bytes()
    assert code.replace("-", "").encode() not in raw and code.encode() not in raw
    # A pending person cannot unlock.
    r = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
    assert r["error"] == "io.kioskauth.PersonNotActive"


def test_whole_activation_at_the_terminal(daemon):
    code = add(daemon, "sarah", "--display-name", "Sarah Lee", "--role", "caregiver", "--role", "family")
    t = Terminal(daemon)
    # Typed in lower case without the hyphen, with an O for a zero if the code has one.
    typed = code.replace("-", "").lower()
    checked = t.call("CheckActivationCode", code=typed)
    assert checked["parameters"]["person"]["name"] == "sarah"
    ticket = checked["parameters"]["ticket"]
    weak = t.call("CompleteActivation", ticket=ticket, passcode="123456", confirmation="123456")
    assert weak["error"] == "io.kioskauth.WeakPasscode" and weak["parameters"]["reason"] == "sequential"
    mismatch = t.call("CompleteActivation", ticket=ticket, passcode="482913", confirmation="482914")
    assert mismatch["parameters"]["reason"] == "mismatch"
    done = t.call("CompleteActivation", ticket=ticket, passcode="482913", confirmation="482913")["parameters"]
    assert done["welcome"] == "You're all set, Sarah. Your role: caregiver and more."
    assert done["roleDescription"].startswith("You can unlock this terminal")
    assert done["person"]["state"] == "active"
    assert daemon.ctl("passcode", "verify", "sarah", input="482913\n").returncode == 0
    # The code is used up: its own message.
    again = Terminal(daemon).call("CheckActivationCode", code=code)
    assert again["error"] == "io.kioskauth.ActivationCodeUsed"
    assert "already been used" in again["parameters"]["message"]


def test_a_ticket_from_another_connection_does_not_complete_activation(daemon):
    code = add(daemon, "sarah")
    ticket = Terminal(daemon).call("CheckActivationCode", code=code)["parameters"]["ticket"]
    r = Terminal(daemon).call("CompleteActivation", ticket=ticket, passcode="482913", confirmation="482913")
    assert r["error"] == "io.kioskauth.TicketInvalid"


def test_expired_code_says_how_to_get_a_new_one(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Activation]\nCodeLifetimeSec=1\n").start()
    code = add(d, "sarah")
    time.sleep(1.5)
    r = Terminal(d).call("CheckActivationCode", code=code)
    assert r["error"] == "io.kioskauth.ActivationCodeExpired"
    assert r["parameters"]["message"] == "This code has expired. Ask your coordinator for a new code."


def test_reissue_kills_the_old_code_and_revoke_kills_the_new(daemon):
    old = add(daemon, "sarah")
    r = daemon.ctl("activation", "issue", "sarah")
    new = CODE.search(r.stdout).group(1)
    assert new != old
    assert Terminal(daemon).call("CheckActivationCode", code=old)["error"] == "io.kioskauth.ActivationCodeRevoked"
    assert daemon.ctl("activation", "revoke", "sarah").returncode == 0
    assert Terminal(daemon).call("CheckActivationCode", code=new)["error"] == "io.kioskauth.ActivationCodeRevoked"


def test_five_wrong_tries_kill_a_persons_code(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Activation]\nTerminalMaxFailures=100\n").start()
    code = add(d, "sarah")
    for remaining in (4, 3, 2, 1, 0):
        r = Terminal(d).call("CheckActivationCode", code="ABCD-EFGH", name="sarah")
        assert r["error"] == "io.kioskauth.ActivationCodeWrong"
        assert r["parameters"]["remainingTries"] == remaining
    assert Terminal(d).call("CheckActivationCode", code=code)["error"] == "io.kioskauth.ActivationCodeRevoked"


def test_five_wrong_codes_on_a_terminal_pause_activation(daemon):
    code = add(daemon, "sarah")
    for _ in range(5):
        assert Terminal(daemon).call("CheckActivationCode", code="ZZZZ-ZZZZ")["error"] == "io.kioskauth.ActivationCodeWrong"
    paused = Terminal(daemon).call("CheckActivationCode", code=code)
    assert paused["error"] == "io.kioskauth.ActivationPaused"
    assert 800 < paused["parameters"]["retryAfterSeconds"] <= 900
    # Every attempt is audited.
    events = json.loads(daemon.ctl("audit", "--json").stdout)["events"]
    assert len([e for e in events if e["action"] == "activation.check"]) == 6


def test_only_authenticators_may_check_codes(daemon):
    code = add(daemon, "sarah")
    r = daemon.call("io.kioskauth.CheckActivationCode", {"code": code}, user="nobody")
    assert r["error"] == "io.kioskauth.PermissionDenied"


def test_admin_setting_a_passcode_activates_without_a_code(daemon):
    code = add(daemon, "sarah")
    assert daemon.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    assert json.loads(daemon.ctl("user", "show", "sarah", "--json").stdout)["person"]["state"] == "active"
    assert Terminal(daemon).call("CheckActivationCode", code=code)["error"] == "io.kioskauth.ActivationCodeRevoked"


def test_export_has_everything_but_secrets(daemon):
    code = add(daemon, "sarah", "--display-name", "Sarah Lee")
    assert daemon.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    r = daemon.ctl("user", "export", "sarah")
    assert r.returncode == 0, r.stderr
    exported = json.loads(r.stdout)
    assert exported["person"]["displayName"] == "Sarah Lee"
    assert [e["action"] for e in exported["audit"]][:2] == ["person.add", "activation.issue"]
    assert exported["activationCodes"][0]["revokedAt"]
    text = r.stdout
    assert "482913" not in text and code not in text and code.replace("-", "") not in text


def test_account_check_refuses_people_who_are_not_active(daemon):
    add(daemon, "sarah")
    r = daemon.call("io.kioskauth.CheckAccount", {"name": "sarah"})["parameters"]
    assert r["allowed"] is False and r["reason"].startswith("Your account is not activated yet")
    assert daemon.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    r = daemon.call("io.kioskauth.CheckAccount", {"name": "sarah"})["parameters"]
    assert r["allowed"] is True and "reason" not in r
    assert daemon.call("io.kioskauth.CheckAccount", {"name": "ghost"})["error"] == "io.kioskauth.NoSuchPerson"
    assert daemon.call("io.kioskauth.CheckAccount", {"name": "sarah"}, user="nobody")["error"] == "io.kioskauth.PermissionDenied"
