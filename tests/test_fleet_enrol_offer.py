"""Templates follow the reader, and a caregiver whose print cannot be used here is asked to
enrol after her passcode, once (issue 17, docs/fleet.md §7). Terminal A has libfprint's
`virtual_image` reader, terminal B `virtual_device`: a finger enrolled at A is no use at B. Real
daemons on a real PostgreSQL directory, and real libpam (the pam_start_confdir client) at B.
"""

from __future__ import annotations

import threading

import pytest

from fleet_support import Fleet, error_name, fleet_test_marks, have_nist_prints, wait_until
from fprint_virtual import scan
from pam_support import PAM_SUCCESS, Client, PamConfig, module_build

pytestmark = [
    *fleet_test_marks(),
    pytest.mark.skipif(not have_nist_prints(), reason="NIST prints not found (set KIOSKAUTH_TESTDATA)"),
]

PASSCODE = "482913"
QUICK = "PollIntervalSec=1\nReconnectMaxSec=1\n"
NO_FINGER_HERE = "Your fingerprint is not set up on this terminal's reader yet."
ENABLE = "Enable fingerprint login? [y/N] "
ENROLLED = "Finger enrolled. Next time, just touch the reader."
LATER = "You can turn on fingerprint login later: ask your coordinator."


@pytest.fixture(scope="module")
def fleet():
    made = Fleet(["virtual_image", "virtual_device"], fleet_config=QUICK)
    made.start()
    yield made
    made.close()


@pytest.fixture
def pam(tmp_path):
    module_build()
    return PamConfig(tmp_path)


def settle(fleet) -> None:
    """Every terminal pushes what it has, then every terminal pulls it."""
    for terminal in fleet.terminals:
        wait_until(lambda t=terminal: "error" not in t.sync() and t.status()["queuedPushes"] == 0,
                   interval=0.3, what=f"{terminal.name}'s queue drained")
    for terminal in fleet.terminals:
        assert "error" not in terminal.sync()


def enrolled_at_a(fleet, name: str, print_name: str) -> None:
    """`name` gets a passcode and a finger (NIST print `print_name`, one per person: A checks
    a new finger is nobody's yet) at A, and B learns of her."""
    a = fleet[0]
    a.add_person(name)
    a.set_passcode(name, PASSCODE)
    enrolled = a.enroll_image(name, print_name)
    assert "error" not in enrolled and enrolled["parameters"]["finger"] == "right-index", enrolled
    settle(fleet)
    assert fleet[1].person(name)["parameters"]["person"]["fingers"] == []


def logs_in_without_an_offer(pam, name: str) -> None:
    """A passcode login whose conversation is the passcode prompt and nothing else."""
    again = Client(pam, "kioskauth", name, "authenticate")
    again.expect_message("Passcode: ")
    again.send(PASSCODE)
    [result] = again.results()
    assert result["rc"] == PAM_SUCCESS
    assert again.messages() == [("prompt_echo_off", "Passcode: ")], again.transcript_lines()


def offered(reply: dict) -> bool:
    assert "error" not in reply, reply
    return reply["parameters"].get("offerFingerprint") is True


def offer_audits(terminal, name: str) -> list[dict]:
    return [e for e in terminal.audit()
            if e["action"] == "person.biometric-offer" and e.get("person") == name and "offered once" in (e.get("detail") or "")]


def test_aPrintForAnotherReader_isOfferedOnce_afterThePasscode_andNeverWhereItWorks(fleet):
    a, b = fleet[0], fleet[1]
    enrolled_at_a(fleet, "nora", "whorl")
    # At A her finger works: no offer.
    assert not offered(a.verify_passcode("nora", PASSCODE))
    # At B it does not: offered after the passcode, once.
    assert offered(b.verify_passcode("nora", PASSCODE))
    assert not offered(b.verify_passcode("nora", PASSCODE))
    assert len(offer_audits(b, "nora")) == 1
    assert b.person("nora")["parameters"]["person"]["biometricOffer"] is False
    # A wrong passcode offers nothing and changes nothing.
    assert error_name(b.verify_passcode("nora", "111111")) == "WrongPasscode"
    # An admin turning the offer back on makes it once more.
    assert "error" not in b.rpc("SetBiometricOffer", {"name": "nora", "enabled": True})
    assert offered(b.verify_passcode("nora", PASSCODE))
    assert not offered(b.verify_passcode("nora", PASSCODE))
    # Eight unlocks at once, each on a connection of its own: still offered exactly once.
    assert "error" not in b.rpc("SetBiometricOffer", {"name": "nora", "enabled": True})
    replies: list[dict] = []

    def unlock() -> None:
        replies.append(b.call("io.kioskauth.VerifyPasscode", {"name": "nora", "passcode": PASSCODE}))

    callers = [threading.Thread(target=unlock) for _ in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    # Each attempt counts as a failure until its hash matches, so a third one in flight delays
    # the rest (PasscodeLocked, never WrongPasscode); of those that got through, one was offered.
    assert len(replies) == 8, replies
    through = [reply for reply in replies if "error" not in reply]
    assert all(error_name(reply) == "PasscodeLocked" for reply in replies if "error" in reply), replies
    assert through and sum(offered(reply) for reply in through) == 1, replies
    # Every attempt that counted itself a failure also cleared it: she is not left delayed.
    person = b.person("nora")["parameters"]["person"]
    assert person["passcodeFailures"] == 0 and not person.get("passcodeLockedUntil"), person
    assert not offered(b.verify_passcode("nora", PASSCODE))
    # The CLI says so too, the one time it is offered.
    assert "error" not in b.rpc("SetBiometricOffer", {"name": "nora", "enabled": True})
    said = b.ctl("passcode", "verify", "nora", input=PASSCODE + "\n")
    assert said.returncode == 0 and "kioskauthctl finger enroll nora" in said.stdout, said.stdout + said.stderr


def test_atThePamLogin_sheIsAskedOnce_enrolsHere_andThePrintGoesToTheFleet(fleet, pam):
    b = fleet[1]
    enrolled_at_a(fleet, "rita", "arch")
    [reader] = b.rpc("GetReaders")["parameters"]["readers"]
    stages = reader["enrollStages"]
    pam.kioskauth("kioskauth", b.socket, "mode=passcode")
    c = Client(pam, "kioskauth", "rita", "authenticate")
    c.expect_message("Passcode: ")
    c.send(PASSCODE)
    c.expect_message(NO_FINGER_HERE)
    c.expect_message(ENABLE)
    c.send("y")
    for stage in range(1, stages + 1):
        c.expect_message(f"Touch the reader (stage {stage} of {stages})…")
        scan(b.sensor, "rita-at-b")
    [result] = c.results()
    assert result["rc"] == PAM_SUCCESS and result["user"] == "rita", c.transcript_lines()
    assert ("info", ENROLLED) in c.messages(), c.transcript_lines()
    assert b.person("rita")["parameters"]["person"]["fingers"] == ["right-index"]
    # The new print is pushed, tagged with B's reader: A keeps its own, B's is for B's kind.
    settle(fleet)
    drivers = fleet.postgres.fleet(
        "SELECT t.driver FROM templates t JOIN people p USING (person_id) WHERE p.name = 'rita' ORDER BY t.driver")
    assert drivers == [["virtual_device"], ["virtual_image"]], drivers
    # The next passcode login asks nothing.
    logs_in_without_an_offer(pam, "rita")


def test_aDeclinedOffer_isNotMadeAgain_andTheLoginGoesOn(fleet, pam):
    b = fleet[1]
    enrolled_at_a(fleet, "sam", "loop-right")
    pam.kioskauth("kioskauth", b.socket, "mode=passcode")
    c = Client(pam, "kioskauth", "sam", "authenticate")
    c.expect_message("Passcode: ")
    c.send(PASSCODE)
    c.expect_message(ENABLE)
    c.send("n")
    [result] = c.results()
    assert result["rc"] == PAM_SUCCESS and result["user"] == "sam"
    assert ("info", LATER) in c.messages()
    assert b.person("sam")["parameters"]["person"]["fingers"] == []
    logs_in_without_an_offer(pam, "sam")
    assert len(offer_audits(b, "sam")) == 1
