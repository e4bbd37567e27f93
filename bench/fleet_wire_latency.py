#!/usr/bin/env python3
"""Two real kioskauthd fleet members and a PostgreSQL this script starts (the same set-up as
tests/test_fleet.py): how long a suspension made at terminal A takes to be refused at terminal B
with no `fleet sync` (A's write wakes its push, the directory's NOTIFY wakes B), and the passcode
unlock latency at a member against a terminal in no fleet. The poll is an hour, so only the
wake-up paths count. Prints figures; asserts nothing about speed.

    KIOSKAUTH_BIN_DIR=.build/debug python3 bench/fleet_wire_latency.py [--rounds 20] [--unlocks 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kioskauth_testing import Daemon  # noqa: E402
from test_fleet import FLEET_CONFIG, PASSCODE, Postgres, call, form_pair, ok  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--unlocks", type=int, default=50)
    args = parser.parse_args()
    made: list[Daemon] = []

    def factory(**kwargs):
        d = Daemon(**kwargs)
        made.append(d)
        return d

    postgres = Postgres().start()
    try:
        # The owner migrates; each terminal logs in as a role of its own (docs/fleet.md §9.7).
        a, b = form_pair(factory, postgres)
        call(a, "AddPerson", name="carol")
        call(a, "SetPasscode", name="carol", passcode=PASSCODE, confirmation=PASSCODE)
        ok(a, "fleet", "sync")
        ok(b, "fleet", "sync")
        delays = []
        for round_ in range(args.rounds):
            suspend = round_ % 2 == 0
            expected = "io.kioskauth.PersonNotActive" if suspend else None
            started = time.monotonic()
            call(a, "SuspendPerson" if suspend else "ResumePerson", name="carol")
            while call(b, "GetPerson", name="carol")["parameters"]["person"]["state"] != (
                    "suspended" if suspend else "active"):
                if time.monotonic() - started > 60:
                    raise SystemExit("a change did not arrive within 60 s")
                time.sleep(0.002)
            delays.append((time.monotonic() - started) * 1000)
            if expected:
                assert call(b, "VerifyPasscode", name="carol", passcode=PASSCODE)["error"] == expected
        print(f"suspend/resume at A -> visible at B, {len(delays)} rounds: p50 {percentile(delays, 50):.1f} ms, "
              f"p95 {percentile(delays, 95):.1f} ms, max {max(delays):.1f} ms")

        plain = factory(config=FLEET_CONFIG).start()
        call(plain, "AddPerson", name="carol")
        call(plain, "SetPasscode", name="carol", passcode=PASSCODE, confirmation=PASSCODE)
        call(a, "ResumePerson", name="carol")
        for label, d in (("no fleet", plain), ("fleet member", a)):
            times = []
            for _ in range(args.unlocks):
                started = time.monotonic()
                reply = call(d, "VerifyPasscode", name="carol", passcode=PASSCODE)
                times.append((time.monotonic() - started) * 1000)
                assert "error" not in reply, reply
            print(f"passcode unlock, {label}, {args.unlocks} calls: p50 {statistics.median(times):.2f} ms, "
                  f"p95 {percentile(times, 95):.2f} ms")
    finally:
        for d in made:
            d.close()
        postgres.stop()


if __name__ == "__main__":
    main()
