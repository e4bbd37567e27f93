"""A directory writer cannot make members use a key it knows (docs/fleet.md §6.2), with real
kioskauthd terminals on a real PostgreSQL directory. The writer here is the cluster's superuser,
who can write any row; it knows every member's public key (they are in the directory) and wraps
keys to them the way HPKE lets anyone (`fleet_support.hpke_wrap`, written from RFC 9180).

- A generation it makes and wraps to every member is refused by each of them, audited and
  counted, and nothing is sealed under it; a key it lists for a generation they hold is refused
  too.
- A member row it adds is left out of the next rotation, which the others take.
- An admission it forges leaves the newcomer pending; the real one still works.
- A public key it lists for the member about to rotate gets no rotation; the member's pushes go
  on, and it rotates once its own key is back.

Before migration 4 both worked: members took the writer's generation at their next pull and
sealed new verifiers under it, and the rotation after a removal was wrapped to the writer's row.

The tests run in order on one fleet.
"""

from __future__ import annotations

import os
import secrets
import sqlite3

import pytest

from fleet_support import Fleet, Terminal, error_name, fleet_test_marks, hpke_wrap, ok, wait_until
from kioskauth_testing import ensure_group

pytestmark = fleet_test_marks()

PASSCODE = "604817"


@pytest.fixture(scope="module")
def fleet():
    ensure_group("kioskauth")
    ensure_group("kioskauth-admin")
    made = Fleet(["virtual_device"] * 3, fleet_config="PollIntervalSec=3600\n")
    made.start()
    yield made
    made.close()


def directory(fleet, query: str) -> list[list[str]]:
    return fleet.postgres.fleet(query)


def forge_generation(fleet, generation: int, key: bytes, chain_mac: bytes | None) -> None:
    """As the superuser: a generation of the writer's making, wrapped to every member."""
    mac = f"'\\x{chain_mac.hex()}'" if chain_mac else "NULL"
    statements = [f"INSERT INTO data_keys (generation, created_by, reason, chain_mac) "
                  f"VALUES ({generation}, NULL, 'terminal removed', {mac})"]
    for terminal in fleet.terminals:
        terminal_id = terminal.terminal_id()
        enc, ciphertext = hpke_wrap(bytes.fromhex(terminal.public_key), terminal_id, generation, key)
        statements.append(f"INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext) "
                          f"VALUES ('{terminal_id}', {generation}, '\\x{enc.hex()}', '\\x{ciphertext.hex()}')")
    directory(fleet, "; ".join(statements))


def refusals(terminal) -> list[dict]:
    return [e for e in terminal.audit() if e["action"] == "fleet.reject" and "data-key generation" in e["detail"]]


def test_aGenerationTheDirectoryWrapsToEveryMember_isRefusedByEach_andNothingIsSealedUnderIt(fleet):
    a, b, c = fleet[0], fleet[1], fleet[2]
    before = {t.name: t.status()["rejectedChanges"] for t in fleet.terminals}
    forge_generation(fleet, 2, os.urandom(32), chain_mac=os.urandom(32))
    for terminal in (a, b, c):
        assert "error" not in terminal.sync(), terminal.name
        status = terminal.status()
        assert status["generation"] == 1, (terminal.name, status)
        assert status["rejectedChanges"] > before[terminal.name], (terminal.name, status)
        # It opened (the wrap is good HPKE to this terminal's key): what fails is the MAC.
        assert "generation 2" in status["lastRejection"], status
        assert "no valid MAC under generation 1" in status["lastRejection"], status
        assert refusals(terminal) and refusals(terminal)[-1]["result"] == "refused", terminal.name

    # A passcode set now is sealed under generation 1, and still unlocks at the other members.
    assert "error" not in a.add_person("nadia")
    assert "error" not in a.set_passcode("nadia", PASSCODE)
    assert "error" not in a.sync()
    assert a.status()["queuedPushes"] == 0
    assert directory(fleet, "SELECT v.generation FROM passcode_verifiers v JOIN people p USING (person_id) "
                            "WHERE p.name = 'nadia'") == [["1"]]
    assert "error" not in b.sync()
    assert "error" not in b.verify_passcode("nadia", PASSCODE)

    # After a restart too: the refused generation was never kept.
    b.restart()
    assert b.status()["generation"] == 1


def test_aKeyTheDirectoryListsForAHeldGeneration_isRefused_andTheHeldOneKept(fleet):
    b = fleet[1]
    # The writer's generation 2 goes first, so that what B refuses now is the key below.
    directory(fleet, "DELETE FROM wrapped_keys WHERE generation = 2; DELETE FROM data_keys WHERE generation = 2")
    b_id = b.terminal_id()
    enc, ciphertext = hpke_wrap(bytes.fromhex(b.public_key), b_id, 1, os.urandom(32))
    count = len(refusals(b))
    directory(fleet, f"UPDATE wrapped_keys SET encapsulated_key = '\\x{enc.hex()}', ciphertext = '\\x{ciphertext.hex()}' "
                     f"WHERE terminal_id = '{b_id}' AND generation = 1")
    assert "error" not in b.sync()
    assert len(refusals(b)) > count
    assert "another key for generation 1" in b.status()["lastRejection"]
    # B still opens what is sealed under its own generation 1.
    assert "error" not in b.verify_passcode("nadia", PASSCODE)
    assert b.status()["generation"] == 1


def test_aMemberRowTheDirectoryAdds_isLeftOutOfTheRotation_andTheOthersTakeIt(fleet):
    a, b, c = fleet[0], fleet[1], fleet[2]
    stranger = "5ca1ab1e-0000-4000-8000-00000000c0de"
    b_id = b.terminal_id()
    # B is down, so that A (not B, woken by the removal) pays the rotation and reports it.
    b.stop()
    directory(fleet, "INSERT INTO terminals (terminal_id, name, public_key, state, db_role, vouch_generation, vouch_mac) "
                     f"VALUES ('{stranger}', 'spare', '\\x{secrets.token_hex(32)}', 'member', 'kt_spare', 1, "
                     f"'\\x{secrets.token_hex(32)}')")
    removed = a.ctl("fleet", "remove", "C")
    assert removed.returncode == 0, removed.stderr
    assert "generation 2" in removed.stdout, removed.stdout
    wrapped_to = {row[0] for row in directory(fleet, "SELECT terminal_id FROM wrapped_keys WHERE generation = 2")}
    assert wrapped_to == {a.terminal_id(), b_id}, wrapped_to
    rotations = [e for e in a.audit() if e["action"] == "fleet.rotate"]
    left_out = [e for e in rotations if e["result"] == "failure"]
    assert left_out and stranger in left_out[-1]["detail"], rotations
    b.start()
    # B takes generation 2 by its MAC under generation 1, and opens what A seals under it.
    assert "error" not in a.set_passcode("nadia", "739201")
    assert "error" not in a.sync()
    assert "error" not in b.sync()
    assert b.status()["generation"] == 2
    assert "error" not in b.verify_passcode("nadia", "739201")
    wait_until(lambda: c.sync() is not None and c.status()["state"] == "removed", interval=0.3,
               what="C noticing its removal")
    assert error_name(c.sync()) == "FleetRemoved"


def test_anAdmissionTheDirectoryForges_leavesTheNewcomerPending_andTheRealOneStillWorks(fleet):
    """The writer marks a joining terminal a member and wraps generations of its own to it,
    with a made-up admission MAC, while the issuer is down. The newcomer checks the MAC with the
    join secret it kept, refuses, stays pending and records the refusal once, however often it
    syncs. The issuer, back, finds in its feed that the token's terminal was made a member (as
    after an admission whose answer was lost): it spends the token and admits nobody with it,
    even once the row is pending again. The newcomer leaves and joins with a new token: the real
    admission is taken, and the secret erased."""
    a = fleet[0]
    d = Terminal("D", fleet.postgres, "virtual_device", "PollIntervalSec=3600\n")
    fleet.terminals.append(d)
    d.start()
    fleet.provision(d)
    token = ok(a.rpc("FleetIssueJoinToken", {"validSeconds": 600}))["token"]
    a.stop()
    joined = d.ctl("fleet", "join", d.url, "--name", "D", input=token + "\n", timeout=120)
    assert joined.returncode == 0, joined.stderr
    d_id = d.terminal_id()
    store = d.state / "kioskauth.sqlite"

    def join_secret_kept() -> bool:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
            return db.execute("SELECT count(*) FROM terminal_state WHERE key = 'fleet.join-secret'").fetchone() == (1,)

    assert join_secret_kept()
    statements = [f"UPDATE terminals SET state = 'member', admitted_through = 2, "
                  f"admission_mac = '\\x{secrets.token_hex(32)}' WHERE terminal_id = '{d_id}'"]
    for generation in (1, 2):
        enc, ciphertext = hpke_wrap(bytes.fromhex(d.public_key), d_id, generation, os.urandom(32))
        statements.append(f"INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext) "
                          f"VALUES ('{d_id}', {generation}, '\\x{enc.hex()}', '\\x{ciphertext.hex()}')")
    directory(fleet, "; ".join(statements))
    for _ in range(3):
        assert "error" not in d.sync()
    status = d.status()
    assert status["state"] == "pending" and status["generation"] == 0, status
    assert "admission MAC" in status["lastRejection"], status
    assert len(refusals(d)) == 1, refusals(d)
    assert join_secret_kept()

    # The writer's rows go; the issuer comes back and spends the token without admitting.
    directory(fleet, f"DELETE FROM wrapped_keys WHERE terminal_id = '{d_id}'; "
                     f"UPDATE terminals SET state = 'pending', admission_mac = NULL, admitted_through = NULL "
                     f"WHERE terminal_id = '{d_id}'")
    a.start()
    assert "error" not in a.sync()
    assert directory(fleet, f"SELECT state FROM terminals WHERE terminal_id = '{d_id}'") == [["pending"]]
    assert directory(fleet, f"SELECT count(*) FROM wrapped_keys WHERE terminal_id = '{d_id}'") == [["0"]]
    # D starts over: it leaves (removing its pending row) and joins with a new token.
    left = d.ctl("fleet", "leave")
    assert left.returncode == 0, left.stderr
    assert not join_secret_kept()
    token = ok(a.rpc("FleetIssueJoinToken", {"validSeconds": 600}))["token"]
    joined = d.ctl("fleet", "join", d.url, "--name", "D", input=token + "\n", timeout=120)
    assert joined.returncode == 0, joined.stderr
    fleet.wait_member(d, a)
    assert d.status()["generation"] == 2
    assert not join_secret_kept()
    assert "error" not in d.verify_passcode("nadia", "739201")


def test_theRemovingMembersOwnKeySwapped_getsNoRotation_andItsPushesGoOn(fleet):
    """The attack a review found on the first version: the writer lists its own public key for
    the member about to rotate. That member wrapped the new generation to it, with a genuine
    MAC under the generation before, which every other member then took. Now the member refuses
    to rotate while its row is not its own; the rotation stays owed, its writes are still pushed
    (under the generation it holds), and once its key is back the next sync pays the rotation."""
    a, b = fleet[0], fleet[1]
    a_id, b_id = a.terminal_id(), b.terminal_id()
    # B is down: woken by the removal, it would pay the rotation itself (leaving A out, whose
    # row then no longer matches its vouch).
    b.stop()
    directory(fleet, f"UPDATE terminals SET public_key = '\\x{secrets.token_hex(32)}' WHERE terminal_id = '{a_id}'")
    removed = a.ctl("fleet", "remove", "D")
    assert removed.returncode == 0, removed.stderr
    assert "not published yet" in removed.stdout, removed.stdout
    assert directory(fleet, "SELECT max(generation) FROM data_keys") == [["2"]]
    assert directory(fleet, "SELECT count(*) FROM terminals WHERE rekey_due") == [["1"]]
    # The owed rotation fails at every sync, but the sync goes on to push.
    assert "error" not in a.set_passcode("nadia", "550912")
    assert "error" not in a.sync()
    assert a.status()["queuedPushes"] == 0
    assert "another public key" in a.status()["lastRejection"], a.status()
    assert directory(fleet, "SELECT v.generation FROM passcode_verifiers v JOIN people p USING (person_id) "
                            "WHERE p.name = 'nadia'") == [["2"]]
    # Its key back (the writer's change undone): the next sync rotates.
    directory(fleet, f"UPDATE terminals SET public_key = '\\x{a.public_key}' WHERE terminal_id = '{a_id}'")
    assert "error" not in a.sync()
    assert directory(fleet, "SELECT max(generation) FROM data_keys") == [["3"]]
    wrapped_to = {row[0] for row in directory(fleet, "SELECT terminal_id FROM wrapped_keys WHERE generation = 3")}
    assert wrapped_to == {a_id, b_id}, wrapped_to
    b.start()
    assert "error" not in b.sync()
    assert b.status()["generation"] == 3
    assert "error" not in b.verify_passcode("nadia", "550912")
