"""Crash-consistency torture: SIGKILL the real daemon in the middle of a burst of mixed writes,
restart it, and check that the store and the audit trail agree (issue #13 item 1).

Shared by tests/test_crash_consistency.py (a short run in CI) and bench/crash_consistency.py (the
long run that prints figures). One store lives through every iteration; each iteration starts the
daemon, lets a few admin clients (each on its own connection, each with its own names) add
people, set passcodes, activate them at the "terminal" (CheckActivationCode, CompleteActivation),
issue new codes, type wrong passcodes and remove people, kills the daemon with SIGKILL at a
random moment, and then checks after a restart:

- every acknowledged write is there (an acknowledged add is a person, an acknowledged remove is
  not, an acknowledged passcode is set and the person active), unless a later write of the same
  client was in flight at the kill;
- replaying the audit trail (person.add, person.remove, passcode.set, activation.complete)
  gives exactly the people, passcode flags and states the store holds: no state change without
  its entry, no entry without its state change;
- every acknowledged write has its audit entry (wrong passcodes included);
- `VerifyAudit` finds the chain intact.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from kioskauth_testing import connect, read_message, send_message

PASSCODES = ("482913", "730516", "294857", "615038")
WRONG = "593071"
PREFIX = "ct"


@dataclass
class Op:
    kind: str  # add, set, complete, issue, wrong, remove
    name: str
    state: str = "sent"  # sent, acked, error


@dataclass
class Figures:
    iterations: int = 0
    acknowledged: int = 0
    lost: int = 0
    audit_mismatches: int = 0
    chain_broken: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"iterations={self.iterations} acknowledged_writes={self.acknowledged} lost={self.lost} "
                f"audit_mismatches={self.audit_mismatches} chain_broken={self.chain_broken}")


class Client:
    """One admin connection; every call is recorded before it is sent."""

    def __init__(self, socket_path: str, log: list[Op]):
        self.s = connect(socket_path, timeout=20.0)
        self.log = log

    def call(self, op: Op, method: str, **parameters) -> dict | None:
        self.log.append(op)
        send_message(self.s, {"method": "io.kioskauth." + method, "parameters": parameters})
        reply = read_message(self.s)
        if reply is None:
            raise ConnectionError
        op.state = "error" if "error" in reply else "acked"
        return reply


def _worker(socket_path: str, worker: str, counter: list[int], rng: random.Random, log: list[Op]) -> None:
    try:
        c = Client(socket_path, log)
        while True:
            counter[0] += 1
            name = f"{PREFIX}{worker}n{counter[0]}"
            added = c.call(Op("add", name), "AddPerson", name=name)
            if "error" in added:
                continue
            code = added["parameters"]["activationCode"]
            passcode = rng.choice(PASSCODES)
            roll = rng.random()
            if roll < 0.15:
                c.call(Op("issue", name), "IssueActivationCode", name=name)
                continue  # left pending, with a fresh live code
            if roll < 0.45:
                checked = c.call(Op("check", name), "CheckActivationCode", code=code)
                if "error" in checked:
                    continue
                c.call(Op("complete", name), "CompleteActivation", ticket=checked["parameters"]["ticket"],
                       passcode=passcode, confirmation=passcode)
            else:
                c.call(Op("set", name), "SetPasscode", name=name, passcode=passcode, confirmation=passcode)
            if rng.random() < 0.5:
                c.call(Op("wrong", name), "VerifyPasscode", name=name, passcode=WRONG)
            if rng.random() < 0.5:
                c.call(Op("remove", name), "RemovePerson", name=name)
    except (OSError, ConnectionError, ValueError):
        return


def _page_audit(socket_path: str) -> list[dict]:
    s = connect(socket_path, timeout=30.0)
    events: list[dict] = []
    after = 0
    while True:
        send_message(s, {"method": "io.kioskauth.GetAudit", "parameters": {"after": after, "limit": 1000}})
        page = read_message(s)["parameters"]["events"]
        events += page
        if len(page) < 1000:
            s.close()
            return events
        after = page[-1]["sequence"]


def _call(socket_path: str, method: str, **parameters) -> dict:
    s = connect(socket_path, timeout=30.0)
    send_message(s, {"method": "io.kioskauth." + method, "parameters": parameters})
    reply = read_message(s)
    s.close()
    return reply


def replay(events: list[dict]) -> dict[str, dict]:
    """The people the audit trail says exist: name -> {hasPasscode, state}."""
    people: dict[str, dict] = {}
    for e in events:
        if e["result"] != "success" or not e.get("person"):
            continue
        name, action = e["person"], e["action"]
        if action == "person.add":
            people[name] = {"hasPasscode": False, "state": "pending_activation"}
        elif action == "person.remove":
            people.pop(name, None)
        elif action in ("passcode.set", "activation.complete") and name in people:
            # Admins set passcodes here, which activates a pending person.
            people[name] = {"hasPasscode": True, "state": "active"}
    return people


AUDITED = {"add": "person.add", "set": "passcode.set", "complete": "activation.complete",
           "issue": "activation.issue", "remove": "person.remove", "check": "activation.check"}


def check(socket_path: str, log: list[Op], figures: Figures) -> None:
    """Checks the store against the clients' acknowledged writes and the audit trail."""
    events = _page_audit(socket_path)
    stored = {p["name"]: p for p in _call(socket_path, "ListPeople")["parameters"]["people"]
              if p["name"].startswith(PREFIX)}
    # The audit trail and the store agree, entry for entry.
    expected = replay([e for e in events if (e.get("person") or "").startswith(PREFIX)])
    for name in sorted(set(expected) | set(stored)):
        got = stored.get(name)
        want = expected.get(name)
        if got is None or want is None or got["hasPasscode"] != want["hasPasscode"] or got["state"] != want["state"]:
            figures.audit_mismatches += 1
            figures.problems.append(
                f"{name}: store {got and (got['state'], got['hasPasscode'])}, audit says {want}")
    # Every acknowledged write is there, unless the same client's next write was in flight.
    last: dict[str, Op] = {}
    for op in log:
        if op.kind in ("add", "remove", "set", "complete"):
            last[op.name] = op
    for name, op in last.items():
        if op.state != "acked":
            continue  # in flight at the kill (either outcome is right) or refused
        got = stored.get(name)
        if op.kind == "remove" and got is not None:
            figures.lost += 1
            figures.problems.append(f"{name}: acknowledged remove, still there")
        elif op.kind == "add" and got is None:
            # a later remove may have been in flight
            if not any(o.name == name and o.kind == "remove" and o.state == "sent" for o in log):
                figures.lost += 1
                figures.problems.append(f"{name}: acknowledged add, missing")
        elif op.kind in ("set", "complete") and not any(
                o.name == name and o.kind == "remove" and o.state == "sent" for o in log):
            if got is None or not got["hasPasscode"] or got["state"] != "active":
                figures.lost += 1
                figures.problems.append(f"{name}: acknowledged {op.kind}, store has {got}")
    # Every acknowledged write has its audit entry.
    counts: dict[tuple[str, str, str], int] = {}
    for e in events:
        key = (e.get("person") or "", e["action"], e["result"])
        counts[key] = counts.get(key, 0) + 1
    acked: dict[tuple[str, str, str], int] = {}
    for op in log:
        if op.state != "acked":
            continue
        key = (op.name, "passcode.verify", "failure") if op.kind == "wrong" else (op.name, AUDITED[op.kind], "success")
        acked[key] = acked.get(key, 0) + 1
    for key, n in acked.items():
        if counts.get(key, 0) < n:
            figures.audit_mismatches += 1
            figures.problems.append(f"{key}: {n} acknowledged, {counts.get(key, 0)} audited")
    verified = _call(socket_path, "VerifyAudit")
    if "error" in verified or not verified["parameters"]["valid"]:
        figures.chain_broken += 1
        figures.problems.append(f"audit verify: {verified}")


def run(daemon, iterations: int, seed: int = 1, workers: int = 3, deadline: float | None = None,
        kill_after: tuple[float, float] = (0.15, 1.0), progress=None) -> Figures:
    """`iterations` rounds of burst, SIGKILL, restart, check, on one store. Stops early at
    `deadline` (a time.monotonic() value)."""
    rng = random.Random(seed)
    figures = Figures()
    log: list[Op] = []
    counters = {w: [0] for w in range(workers)}
    for iteration in range(iterations):
        if deadline is not None and time.monotonic() > deadline:
            break
        daemon.start()
        threads = [
            threading.Thread(target=_worker, args=(daemon.socket, f"{w}i{iteration}", counters[w],
                                                   random.Random(rng.random()), log), daemon=True)
            for w in range(workers)
        ]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(*kill_after))
        daemon.kill()
        for t in threads:
            t.join(timeout=30)
        daemon.start()
        check(daemon.socket, log, figures)
        daemon.stop()
        figures.iterations += 1
        figures.acknowledged = sum(1 for op in log if op.state == "acked")
        if progress:
            progress(figures)
    return figures
