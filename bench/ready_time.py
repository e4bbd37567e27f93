#!/usr/bin/env python3
"""Time from exec to READY=1 against the number of audit events and of people in the store.

Two series on one store each: with 0 people (one person who unlocks), and with --people people
(each added and given a passcode through the API, two audit events per person). In each
series the trail is grown through the real API to every size in --sizes (sizes below what the
series already holds are skipped), the daemon is stopped cleanly and then started --runs times,
timing each start from exec to READY=1 on its NOTIFY_SOCKET. Prints the median and the fastest
start per cell. Start-up should be flat in the number of events: the check before serving
verifies the audit chain only from the sealed checkpoint (the anchored head) on; the whole chain
is verified by `audit verify` and the scheduled check.

The events are passcode unlocks (VerifyPasscode, pipelined on one connection), with Argon2id
set to its cheapest so that filling 100,000 events takes a minute, not an hour; the store's
contents are the same as with real costs.

    KIOSKAUTH_BIN_DIR=.build/release python3 bench/ready_time.py \\
        [--sizes 0,1000,10000,100000] [--people 0,1000] [--runs 5] [--bin-dirs A,B]

With --bin-dirs, every cell is timed with each build in turn on the same store (the first one
fills it), so two builds compare in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import kioskauth_testing  # noqa: E402
from kioskauth_testing import Daemon, connect, read_message, send_message  # noqa: E402

CHEAP_HASH_CONFIG = """
[Store]
PasscodeHashMemoryKiB=8
PasscodeHashIterations=1
AuditVerifyInterval=0
"""

PASSCODE = "482913"


def pipelined(daemon: Daemon, calls: list[dict], window: int = 256) -> None:
    """Sends `calls` on one connection, at most `window` unanswered, and checks every reply."""
    s = connect(daemon.socket, timeout=120)
    try:
        sent = answered = 0
        while answered < len(calls):
            while sent < len(calls) and sent - answered < window:
                send_message(s, calls[sent])
                sent += 1
            reply = read_message(s)
            assert reply is not None and "error" not in reply, reply
            answered += 1
    finally:
        s.close()


def add_people(daemon: Daemon, count: int) -> None:
    names = [f"person{index:05d}" for index in range(count)]
    pipelined(daemon, [{"method": "io.kioskauth.AddPerson",
                        "parameters": {"name": name, "displayName": name.title(), "roles": ["caregiver"]}}
                       for name in names])
    pipelined(daemon, [{"method": "io.kioskauth.SetPasscode", "parameters": {"name": name, "passcode": PASSCODE, "confirmation": PASSCODE}}
                       for name in names])


def audit_events(daemon: Daemon) -> int:
    s = connect(daemon.socket)
    try:
        send_message(s, {"method": "io.kioskauth.GetStatus"})
        return read_message(s)["parameters"]["auditEvents"]
    finally:
        s.close()


def grow(daemon: Daemon, target: int) -> int:
    """Unlocks the person `unlocker` until the trail holds `target` events (or more)."""
    missing = target - audit_events(daemon)
    if missing > 0:
        call = {"method": "io.kioskauth.VerifyPasscode", "parameters": {"name": "unlocker", "passcode": PASSCODE}}
        pipelined(daemon, [call] * missing)
    return audit_events(daemon)


def use(bin_dir: Path) -> None:
    kioskauth_testing.KIOSKAUTHD = bin_dir / "kioskauthd"


def time_to_ready(daemon: Daemon) -> float:
    started = time.monotonic()
    daemon.start(timeout=300)
    elapsed = time.monotonic() - started
    daemon.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,1000,10000,100000")
    parser.add_argument("--people", default="0,1000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bin-dirs", default=str(kioskauth_testing.BIN_DIR))
    args = parser.parse_args()
    bin_dirs = [Path(x).resolve() for x in args.bin_dirs.split(",")]
    use(bin_dirs[0])
    print(f"{'build':<40} {'people':>7} {'events':>8} {'median ms':>10} {'min ms':>8}", flush=True)
    for people in (int(x) for x in args.people.split(",")):
        daemon = Daemon(config=CHEAP_HASH_CONFIG).start(timeout=120)
        try:
            add_people(daemon, people)
            pipelined(daemon, [
                {"method": "io.kioskauth.AddPerson",
                 "parameters": {"name": "unlocker", "displayName": "Unlocker", "roles": ["caregiver"]}},
                {"method": "io.kioskauth.SetPasscode", "parameters": {"name": "unlocker", "passcode": PASSCODE, "confirmation": PASSCODE}},
            ])
            for size in (int(x) for x in args.sizes.split(",")):
                if daemon.proc is None or daemon.proc.poll() is not None:
                    daemon.start(timeout=300)
                if size and size < audit_events(daemon):
                    continue
                events = grow(daemon, size)
                daemon.stop()
                times: dict[Path, list[float]] = {b: [] for b in bin_dirs}
                for _ in range(args.runs):
                    for bin_dir in bin_dirs:
                        use(bin_dir)
                        times[bin_dir].append(time_to_ready(daemon) * 1000)
                use(bin_dirs[0])
                for bin_dir in bin_dirs:
                    label = str(bin_dir)[-40:]
                    print(f"{label:<40} {people:>7} {events:>8} {statistics.median(times[bin_dir]):>10.1f} "
                          f"{min(times[bin_dir]):>8.1f}", flush=True)
        finally:
            daemon.close()


if __name__ == "__main__":
    main()
