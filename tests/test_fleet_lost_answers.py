"""Fleet operations whose answer is lost (docs/fleet.md §6.1). The directory applies `fleet
create`, `fleet join`, `fleet remove` or `fleet leave`, but the terminal never hears back: its
proxy lets the statement through and holds the answer, and the daemon gives up after
`[Fleet] OperationTimeoutSec=3`. The reply says the operation may have been applied and that
running the same command again finishes it; running it again does, also after the daemon was
killed in between. Real daemons, a real PostgreSQL.
"""

from __future__ import annotations

import pytest

from fleet_support import (
    CONDITION_TIMEOUT,
    Fleet,
    Terminal,
    error_name,
    fleet_test_marks,
    ok,
    wait_until,
)

pytestmark = fleet_test_marks()

TIMEOUT = "OperationTimeoutSec=3\n"
PASSCODE = "47112358"


@pytest.fixture
def unformed():
    """A directory (migrated) and terminals A and B with their roles, in no fleet yet."""
    fleet = Fleet(["virtual_device", "virtual_device"], fleet_config=TIMEOUT)
    try:
        fleet.postgres.start()
        for name in ("A", "B"):
            terminal = Terminal(name, fleet.postgres, "virtual_device", TIMEOUT)
            fleet.terminals.append(terminal)
            terminal.start()
        a = fleet.terminals[0]
        ok(a.rpc("FleetMigrate", {"directory": a.owner_url, "password": fleet.postgres.password}))
        for terminal in fleet.terminals:
            fleet.provision(terminal)
        yield fleet
    finally:
        fleet.close()


def lost(reply: dict) -> str:
    """The reason of a FleetUnreachable that says the operation may have been applied."""
    assert error_name(reply) == "FleetUnreachable", reply
    reason = reply["parameters"]["reason"]
    assert "may have been applied" in reason and "run " in reason and " again" in reason, reason
    return reason


def directory_terminals(fleet: Fleet) -> dict[str, tuple[str, str]]:
    return {row[0]: (row[1], row[2]) for row in fleet.postgres.fleet("SELECT terminal_id, name, state FROM terminals")}


def reconnected(terminal: Terminal) -> None:
    """Waits until the terminal's sync gets past the directory connection: `Proxy.restore` drops
    every connection it relays, also one the daemon opened a moment before, and a call already
    sent on that one fails (as it should) before the daemon connects again."""
    wait_until(lambda: error_name(terminal.sync()) != "FleetUnreachable", what=f"{terminal.name} reconnected")


def knows(terminal: Terminal, name: str) -> bool:
    reply = terminal.person(name)
    return "error" not in reply and reply["parameters"]["person"].get("hasPasscode") is True


def test_a_create_whose_answer_was_lost_is_finished_by_running_it_again_even_after_a_kill(unformed):
    a, b = unformed.terminals
    a.add_person("nina")
    a.set_passcode("nina", PASSCODE)

    a.proxy.stall_after(b"fleet_bootstrap(")
    reason = lost(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    # The directory did create the fleet, with A as its member; A has not recorded it.
    rows = directory_terminals(unformed)
    assert [state for _, state in rows.values()] == ["member"], rows
    assert a.status()["configured"] is False, reason

    # The daemon dies before anyone retries; the attempt it had recorded survives.
    a.proxy.restore()
    a.kill()
    a.start()
    created = ok(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    assert created["terminalId"] in rows, (created, rows)
    status = a.status()
    assert status["state"] == "member" and status["generation"] == 1, status
    assert "from an earlier attempt" in a.log_text()
    assert directory_terminals(unformed) == rows, "no second terminal row"

    # The key A took back is the fleet's: a terminal joining now opens what A pushed.
    unformed.join(b, issuer=a)
    ok(a.sync())
    wait_until(lambda: ok(b.sync()) is not None and knows(b, "nina"), timeout=CONDITION_TIMEOUT,
               what="nina, with her passcode, at B")
    assert "error" not in b.verify_passcode("nina", PASSCODE)
    assert b.status()["rejectedChanges"] == 0


def test_a_join_whose_answer_was_lost_is_finished_by_running_it_again_with_the_same_token(unformed):
    a, b = unformed.terminals
    ok(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    a.add_person("nina")
    a.set_passcode("nina", PASSCODE)
    token = ok(a.rpc("FleetIssueJoinToken", {"validSeconds": 600}))["token"]

    b.proxy.stall_after(b"fleet_join(")
    lost(b.rpc("FleetJoin", {"directory": b.url, "token": token, "name": "B"}))
    # The directory registered B (and A, woken by it, may have admitted B already).
    rows = directory_terminals(unformed)
    assert sorted(name for name, _ in rows.values()) == ["A", "B"], rows
    assert b.status()["configured"] is False

    b.proxy.restore()
    b.kill()
    b.start()
    # Through the CLI, as an admin would, with the same token on standard input.
    joined = b.ctl("fleet", "join", b.url, "--name", "B", input=token + "\n", timeout=60)
    assert joined.returncode == 0, f"{joined.stdout}{joined.stderr}"
    assert directory_terminals(unformed).keys() == rows.keys(), "no second terminal row"
    unformed.wait_member(b, issuer=a)
    wait_until(lambda: ok(b.sync()) is not None and knows(b, "nina"), what="nina, with her passcode, at B")
    assert "error" not in b.verify_passcode("nina", PASSCODE)


def test_a_remove_and_a_leave_whose_answers_were_lost_are_finished_by_running_them_again(unformed):
    a, b = unformed.terminals
    ok(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    unformed.join(b, issuer=a)
    c = Terminal("C", unformed.postgres, "virtual_device", TIMEOUT)
    unformed.terminals.append(c)
    c.start()
    unformed.join(c, issuer=a)
    c_id = c.terminal_id()

    # A removes C; the removal is applied, its answer lost. Again: done, with the rotation.
    a.proxy.stall_after(b"fleet_remove_terminal(")
    # Repeated by id, as the reply says: by then another terminal could have taken the name.
    assert f"fleet remove {c_id}" in lost(a.rpc("FleetRemoveTerminal", {"terminal": "C"}))
    assert directory_terminals(unformed)[c_id][1] == "removed"
    a.proxy.restore()
    reconnected(a)
    removed = ok(a.rpc("FleetRemoveTerminal", {"terminal": c_id}))
    # The rotation the removal owes is paid: by this call, or already by a member's sync.
    assert removed["terminalId"] == c_id and not removed["rotationOwed"], removed
    assert unformed.postgres.fleet("SELECT max(generation) FROM data_keys") == [["2"]]

    # B leaves; its removal is applied, the answer lost. Again: B leaves.
    b_id = b.terminal_id()
    b.proxy.stall_after(b"fleet_remove_terminal(")
    lost(b.rpc("FleetLeave"))
    assert directory_terminals(unformed)[b_id][1] == "removed"
    b.proxy.restore()
    reconnected(b)
    ok(b.rpc("FleetLeave"))
    assert b.status()["configured"] is False


def test_a_token_whose_admission_answer_was_lost_is_spent_so_a_row_set_back_to_pending_is_not_admitted_again(unformed):
    """A admits B, but the answer is lost: A never marks the token used. Later B is removed,
    and a directory writer sets B's row back to `pending`, proof and all (docs/fleet.md §6.2).
    A must not admit it again, with every generation including the one made since. A spends
    the token as soon as its feed shows B a member (or removed)."""
    a, b = unformed.terminals
    ok(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    token = ok(a.rpc("FleetIssueJoinToken", {"validSeconds": 600}))["token"]
    a.proxy.stall_after(b"fleet_admit_keys(")
    joined = b.ctl("fleet", "join", b.url, "--name", "B", input=token + "\n", timeout=60)
    assert joined.returncode == 0, joined.stderr
    b_id = b.terminal_id()
    # A, woken by the join, admits B; the answer is held, and A gives up on it.
    wait_until(lambda: directory_terminals(unformed)[b_id][1] == "member", what="B admitted in the directory")
    a.proxy.restore()
    reconnected(a)
    wait_until(lambda: ok(b.sync()) is not None and b.status()["state"] == "member", what="B taking its keys")

    removed = ok(a.rpc("FleetRemoveTerminal", {"terminal": "B"}))
    assert not removed["rotationOwed"], removed
    assert unformed.postgres.fleet("SELECT max(generation) FROM data_keys") == [["2"]]
    unformed.postgres.fleet(f"UPDATE terminals SET state = 'pending', removed_at = NULL WHERE terminal_id = '{b_id}'")
    ok(a.sync())
    assert directory_terminals(unformed)[b_id][1] == "pending"
    assert unformed.postgres.fleet(f"SELECT count(*) FROM wrapped_keys WHERE terminal_id = '{b_id}'") == [["0"]]


def test_a_leave_once_the_directory_has_removed_the_terminal_unbeknown_to_it_forgets_the_fleet(unformed):
    """What a lost leave can leave behind, made deterministic: the directory has removed B (here
    A did, while B was cut off), B still believes it is a member and has a write queued that the
    directory no longer takes from it. A leave as soon as the network is back (before B's sync
    service, backing off, learns of it) forgets the fleet without pushing; it used to fail on
    that push ("not a fleet member")."""
    a, b = unformed.terminals
    ok(a.rpc("FleetCreate", {"directory": a.url, "name": "A"}))
    unformed.join(b, issuer=a)
    b.proxy.cut()
    ok(a.rpc("FleetRemoveTerminal", {"terminal": "B"}))
    b.add_person("omar")
    b.set_passcode("omar", PASSCODE)
    standing = b.status()
    assert standing["state"] == "member" and standing["queuedPushes"] >= 1, standing
    b.proxy.restore()
    ok(b.rpc("FleetLeave"))
    assert b.status()["configured"] is False
    assert "error" not in b.person("omar"), "its people stay"
    assert not unformed.postgres.fleet("SELECT 1 FROM people WHERE name = 'omar'")


@pytest.mark.parametrize("value", ["0", "601", "1e16", "soon"])
def test_an_operation_timeout_out_of_range_is_a_named_configuration_error(make_daemon, value):
    d = make_daemon(config=f"\n[Fleet]\nOperationTimeoutSec={value}\n")
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "OperationTimeoutSec" in d.log_text() and "expected a number of seconds in 1...600" in d.log_text(), \
        d.log_text()
