#!/usr/bin/env python3
"""How fast a change at one terminal is usable at another (docs/fleet.md §11).

Starts a real PostgreSQL directory and two real kioskauthd terminals, A and B, both on
libfprint's `virtual_image` driver (so templates are compatible), joined into one fleet through
tests/fleet_support.py; each reaches the directory over loopback TCP through a relay. The
backstop poll is left at its default (30 s), so what is measured is the NOTIFY path. Each run:

* passcode: A adds a person and sets her passcode; from A's SetPasscode reply (A's commit) B
  tries VerifyPasscode every --interval seconds until it succeeds;
* identify (unless --no-identify): A enrols her finger (the NIST print `whorl`); from A's
  EnrollFinger reply B checks GetPerson every --interval seconds until the finger is there, then
  identifies at once with a second impression (`whorl-rot`); the figure is A's reply to B's
  successful Identify reply (so it includes one identify);
* revocation: A suspends her; from A's SuspendPerson reply B tries VerifyPasscode until it is
  refused with PersonNotActive.

A then removes her (so the next run can enrol the same print). Identifying by polling would
pause walk-up identify after a few unknown fingers, hence the GetPerson poll. The virtual
reader overheats after about 3 minutes of scanning, so a terminal is restarted (same store,
still a member) before its scans add up to 90 s.

Prints median, p95 and max per measurement, in milliseconds; the resolution is --interval.

    KIOSKAUTH_BIN_DIR=.build/debug .build-venv/bin/python bench/fleet_propagation.py [--runs 20]
        [--interval 0.01] [--no-identify] [--poll SECONDS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fleet_support import Fleet, error_name, ok  # noqa: E402

PASSCODE = "482913"
HEAT_BUDGET = 90.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Heat:
    """Seconds each terminal's reader has scanned since its daemon started."""

    def __init__(self):
        self.used: dict[str, float] = {}

    def spend(self, terminal, seconds: float) -> None:
        self.used[terminal.name] = self.used.get(terminal.name, 0.0) + seconds
        if self.used[terminal.name] > HEAT_BUDGET:
            terminal.restart()  # waits for the reader again
            self.used[terminal.name] = 0.0


def poll(condition, interval: float, timeout: float = 120.0) -> float:
    """Calls `condition` every `interval` s until true; returns the monotonic time it was."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError("no propagation within 120 s")
        time.sleep(interval)


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"passcode": [], "identify": [], "revocation": []}
    heat = Heat()
    fleet_config = "ReconnectMaxSec=2\n" + (f"PollIntervalSec={args.poll}\n" if args.poll else "")
    with Fleet(["virtual_image", "virtual_image"], fleet_config=fleet_config) as fleet:
        a, b = fleet.terminals
        for n in range(args.runs):
            name = f"bench{n}"
            a.add_person(name)
            a.set_passcode(name, PASSCODE)
            committed = time.monotonic()
            seen = poll(lambda: "error" not in b.verify_passcode(name, PASSCODE), args.interval)
            results["passcode"].append(seen - committed)

            if args.identify:
                started = time.monotonic()
                enrolled = a.enroll_image(name, "whorl")
                committed = time.monotonic()
                heat.spend(a, committed - started)
                assert enrolled.get("parameters", {}).get("finger") == "right-index", enrolled

                def has_finger():
                    reply = b.person(name)
                    return "error" not in reply and reply["parameters"]["person"]["fingers"] == ["right-index"]

                poll(has_finger, args.interval)
                started = time.monotonic()
                identified = b.identify_image("whorl-rot")
                unlocked = time.monotonic()
                heat.spend(b, unlocked - started)
                person = identified.get("parameters", {}).get("person", {})
                assert person.get("name") == name, identified
                results["identify"].append(unlocked - committed)

            ok(a.rpc("SuspendPerson", {"name": name}))
            committed = time.monotonic()
            refused = poll(lambda: error_name(b.verify_passcode(name, PASSCODE)) == "PersonNotActive", args.interval)
            results["revocation"].append(refused - committed)

            ok(a.rpc("RemovePerson", {"name": name}))
            poll(lambda: error_name(b.person(name)) == "NoSuchPerson", args.interval)
            print(f"run {n + 1}/{args.runs}: " + ", ".join(
                f"{k} {v[-1] * 1000:.0f} ms" for k, v in results.items() if v), file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.01, help="B's polling interval, seconds")
    parser.add_argument("--no-identify", dest="identify", action="store_false")
    parser.add_argument("--poll", type=float, default=None,
                        help="[Fleet] PollIntervalSec for both terminals (default: the daemon's, 30 s)")
    args = parser.parse_args()
    results = run(args)
    labels = {
        "passcode": "passcode set at A -> unlock at B",
        "identify": "finger enrolled at A -> identify at B",
        "revocation": "suspended at A -> refused at B",
    }
    print(f"\npoll: {args.poll or 'default (30 s)'}; runs: {args.runs}; B polls every {args.interval} s")
    print(f"{'propagation (ms)':<40} {'runs':>5} {'median':>8} {'p95':>8} {'max':>8}")
    for key, values in results.items():
        if not values:
            continue
        ms = [v * 1000 for v in values]
        print(f"{labels[key]:<40} {len(ms):>5} {statistics.median(ms):>8.1f} {percentile(ms, 95):>8.1f} {max(ms):>8.1f}")


if __name__ == "__main__":
    main()
