"""Removing a terminal from the fleet, and the data-key rotation it owes (issue 17, docs/fleet.md
§3 and §9.8), with real kioskauthd terminals on a real PostgreSQL directory:

- an admin at one terminal removes another (a stolen or retired one) by name; the directory
  refuses it from then on, a new data-key generation is wrapped to the remaining members, and
  what is written afterwards never reaches the removed terminal, which notices, forgets its keys
  and says so;
- a terminal admitted after the rotation is given every generation, so people whose secrets
  were sealed before it still unlock there;
- a terminal that leaves on its own is followed by exactly one rotation, by whichever member
  syncs first.

The tests run in order on one fleet (each builds on the one before).
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from fleet_support import CONDITION_TIMEOUT, Fleet, Terminal, error_name, fleet_test_marks, wait_until
from kioskauth_testing import ensure_group

pytestmark = fleet_test_marks()

FIRST, SECOND, THIRD = "482913", "730164", "915372"
QUICK = "PollIntervalSec=1\nReconnectMaxSec=1\n"
# A wrong passcode tried on purpose must not delay the right one after it.
NO_DELAYS = "\n[Passcode]\nLockoutDelaysSec=0\n"


@pytest.fixture(scope="module")
def fleet():
    # The daemons look their groups up when they start.
    ensure_group("kioskauth")
    ensure_group("kioskauth-admin")
    made = Fleet(["virtual_device"] * 3, fleet_config=QUICK, config=NO_DELAYS)
    made.start()
    yield made
    made.close()


def directory(fleet, query: str) -> list[list[str]]:
    return fleet.postgres.fleet(query)


def generations(fleet, terminal: Terminal) -> list[int]:
    rows = directory(fleet, f"SELECT generation FROM wrapped_keys WHERE terminal_id = '{terminal.terminal_id()}' "
                            "ORDER BY generation")
    return [int(row[0]) for row in rows]


def verifier_generation(fleet, name: str) -> int:
    rows = directory(fleet, "SELECT v.generation FROM passcode_verifiers v JOIN people p USING (person_id) "
                            f"WHERE p.name = '{name}'")
    return int(rows[0][0])


def unlocks(terminal: Terminal, name: str, passcode: str) -> bool:
    return "error" not in terminal.verify_passcode(name, passcode)


def settle(writer: Terminal, *readers: Terminal) -> None:
    """The writer's queue reaches the directory, then each reader pulls everything there is (so a
    passcode is tried once, when it must work: wrong tries would count towards a lockout)."""
    def pushed():
        writer.sync()
        return writer.status()["queuedPushes"] == 0

    wait_until(pushed, timeout=CONDITION_TIMEOUT, interval=0.3, what=f"{writer.name}'s queue drained")
    for reader in readers:
        assert "error" not in reader.sync(), reader.name


def audit_actions(terminal: Terminal, action: str) -> list[dict]:
    return [e for e in terminal.audit() if e["action"] == action]


def test_fleetTerminalsAndRemove_areForAdminsOnly_andARefusalChangesNothing(fleet):
    a, c = fleet[0], fleet[2]
    for groups in ([], ["kioskauth"]):
        for method, parameters in (("FleetTerminals", {}), ("FleetRemoveTerminal", {"terminal": "C"})):
            reply = a.call(f"io.kioskauth.{method}", parameters, user="nobody", groups=groups)
            assert error_name(reply) == "PermissionDenied", (method, groups, reply)
    # The kiosk-app group is privileged for unlocks, so its refusal is audited on its own.
    refused = [e for e in audit_actions(a, "fleet.remove") if e["result"] == "refused"]
    assert refused and refused[-1]["callerUid"] == 65534, refused
    assert directory(fleet, "SELECT count(*) FROM terminals WHERE state = 'member'") == [["3"]]
    # A member of the admin group (not root) may list them.
    listed = a.call("io.kioskauth.FleetTerminals", {}, user="nobody", groups=["kioskauth-admin"])
    assert "error" not in listed, listed
    terminals = listed["parameters"]["terminals"]
    assert [(t["name"], t["state"], t["isThisTerminal"]) for t in terminals] == [
        ("A", "member", True), ("B", "member", False), ("C", "member", False)]
    assert c.status()["state"] == "member"


def test_removingAStolenTerminal_rotatesTheKey_andWhatIsWrittenAfterNeverReachesIt(fleet):
    a, b, c = fleet[0], fleet[1], fleet[2]
    for name in ("olga", "petra"):
        a.add_person(name)
        a.set_passcode(name, FIRST)
    settle(a, b, c)
    for terminal in (b, c):
        assert unlocks(terminal, "olga", FIRST) and unlocks(terminal, "petra", FIRST), terminal.name
    assert verifier_generation(fleet, "olga") == 1

    # Named errors for what cannot be removed; nothing changes.
    assert error_name(a.rpc("FleetRemoveTerminal", {"terminal": "Z"})) == "FleetTerminalNotFound"
    reply = a.rpc("FleetRemoveTerminal", {"terminal": "A"})
    assert error_name(reply) == "FleetError" and "fleet leave" in reply["parameters"]["reason"], reply
    assert error_name(a.rpc("FleetRemoveTerminal", {"terminal": ""})) == "InvalidInput"
    assert directory(fleet, "SELECT count(*) FROM data_keys") == [["1"]]

    listed = a.ctl("fleet", "terminals")
    assert listed.returncode == 0, listed.stderr
    listing = listed.stdout
    assert listing.count("member") == 3 and listing.startswith("*"), listing
    # The removal owes a rotation, and every member races for it (exactly one wins). B, woken by
    # the removal's change, sometimes publishes generation 2 before A does: A then takes it
    # before it reports (it used to report generation 1, the one it still held).
    removed = a.ctl("fleet", "remove", "C")
    assert removed.returncode == 0, removed.stderr
    assert "removed C" in removed.stdout and "generation 2" in removed.stdout, removed.stdout

    # The directory: C removed with no key left, generation 2 wrapped to exactly A and B, no
    # rotation still owed.
    c_id = c.terminal_id()
    assert directory(fleet, f"SELECT state FROM terminals WHERE terminal_id = '{c_id}'") == [["removed"]]
    assert generations(fleet, c) == []
    assert generations(fleet, a) == [1, 2] and generations(fleet, b) == [1, 2]
    assert directory(fleet, "SELECT count(*) FROM terminals WHERE rekey_due") == [["0"]]
    assert a.status()["generation"] == 2
    remove_events = [e for e in audit_actions(a, "fleet.remove") if e["result"] == "success"]
    assert len(remove_events) == 1 and c_id in remove_events[0]["detail"], remove_events
    def rotations() -> int:
        return len(audit_actions(a, "fleet.rotate")) + len(audit_actions(b, "fleet.rotate"))

    wait_until(lambda: rotations() >= 1, what="the rotation audited by the member that published it")
    assert rotations() == 1

    # A new passcode set at A is sealed under generation 2 and unlocks at B.
    a.set_passcode("olga", SECOND)
    settle(a, b)
    assert unlocks(b, "olga", SECOND)
    assert verifier_generation(fleet, "olga") == 2
    assert b.status()["generation"] == 2

    # C finds out at its next sync (or its own poll already did), forgets its keys and queue, says
    # so, and syncs no more.
    def noticed():
        c.sync()
        return c.status()["state"] == "removed"

    wait_until(noticed, interval=0.3, what="C noticing its removal")
    status = c.status()
    assert status["generation"] == 0 and status["queuedPushes"] == 0, status
    assert "removed" in (status["lastError"] or ""), status
    assert error_name(c.sync()) == "FleetRemoved"
    assert error_name(c.rpc("FleetTerminals")) == "FleetRemoved"
    assert len(audit_actions(c, "fleet.removed")) == 1
    with sqlite3.connect(f"file:{c.state / 'kioskauth.sqlite'}?mode=ro", uri=True, timeout=30) as db:
        assert db.execute("SELECT count(*) FROM fleet_keys").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM fleet_outbox").fetchone() == (0,)
    # What was written after the removal never reached it; what it had stays local.
    assert not unlocks(c, "olga", SECOND)
    assert unlocks(c, "olga", FIRST)
    # Its writes go nowhere: a suspension at C is neither queued nor seen by the fleet.
    assert "error" not in c.rpc("SuspendPerson", {"name": "petra"})
    assert c.status()["queuedPushes"] == 0
    assert directory(fleet, "SELECT state FROM people WHERE name = 'petra'") == [["active"]]
    # `fleet leave` on a removed terminal only forgets, without the directory.
    left = c.ctl("fleet", "leave")
    assert left.returncode == 0, left.stderr
    assert c.status()["configured"] is False


def test_aTerminalAdmittedAfterTheRotation_unlocksPeopleSealedBeforeAndAfterIt(fleet):
    a = fleet[0]
    d = Terminal("D", fleet.postgres, "virtual_device", QUICK)
    fleet.terminals.append(d)  # closed with the fleet
    d.start()
    fleet.join(d, issuer=a)
    assert generations(fleet, d) == [1, 2]
    assert d.status()["generation"] == 2
    # petra's verifier is still the one sealed under generation 1, olga's under 2.
    assert verifier_generation(fleet, "petra") == 1
    assert "error" not in d.sync()
    assert unlocks(d, "petra", FIRST)
    assert unlocks(d, "olga", SECOND)
    assert d.status()["rejectedChanges"] == 0, d.status()


def test_aTerminalLeavingOnItsOwn_isFollowedByExactlyOneRotation(fleet):
    a, b, d = fleet[0], fleet[1], fleet[3]
    b_id = b.terminal_id()
    left = b.ctl("fleet", "leave")
    assert left.returncode == 0, left.stderr

    # Both remaining members sync at the same moment; one of them publishes generation 3, and
    # only one does.
    def rotated():
        both = [threading.Thread(target=terminal.sync) for terminal in (a, d)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join()
        return directory(fleet, "SELECT max(generation) FROM data_keys") == [["3"]]

    wait_until(rotated, interval=0.3, what="generation 3 published after B left")
    for terminal in (a, d):
        terminal.sync()
    assert directory(fleet, "SELECT count(*) FROM data_keys") == [["3"]]
    rotations = [e for t in (a, d) for e in audit_actions(t, "fleet.rotate") if "generation 3" in e["detail"]]
    assert len(rotations) == 1, rotations
    assert generations(fleet, a) == [1, 2, 3] and generations(fleet, d) == [1, 2, 3]
    assert directory(fleet, f"SELECT count(*) FROM wrapped_keys WHERE terminal_id = '{b_id}'") == [["0"]]
    a.set_passcode("olga", THIRD)
    settle(a, d)
    assert unlocks(d, "olga", THIRD)
    assert verifier_generation(fleet, "olga") == 3


def test_aMemberStopsCleanly_closingItsDirectoryConnections(fleet):
    """SIGTERM on a fleet member with both directory connections open (pulls and pushes, and
    the LISTEN one): it exits 0 at once. Before the sync service closed them, PostgresNIO's
    check for a connection dropped open crashed the daemon on its way out (debug builds), and
    the crash report held the stop up for seconds."""
    a, d = fleet[0], fleet[3]
    for terminal in (a, d):
        assert "error" not in terminal.sync()
        wait_until(lambda t=terminal: t.status()["reachable"], what=f"{terminal.name} connected")
        started = time.monotonic()
        assert terminal.stop(timeout=30) == 0, terminal.log_text()[-3000:]
        assert time.monotonic() - started < 5, f"{terminal.name} took {time.monotonic() - started:.1f} s to stop"
        assert "Program crashed" not in terminal.log_text(), terminal.log_text()[-3000:]
