#!/usr/bin/env python3
"""What the fleet helper (docs/fleet.md §9.11) costs and saves, build against build, in one run.

For each build in --bin-dirs (a directory holding kioskauthd, and kioskauth-fleet if that build
has one), taking turns --repeat times: a PostgreSQL this script starts, two real kioskauthd
terminals in one fleet (the set-up of tests/test_fleet.py, no reader), and then

* memory at idle, after a sync and --settle seconds: VmRSS and PSS of each daemon, and of its
  fleet helper if it has one (the processes named kioskauth-fleet whose parent is the daemon);
* `FleetSync` round trips at B (pull, push, pull: every directory operation of a sync crosses
  the helper's socket pair) over --syncs calls;
* a suspension at A until B sees it (A's push, the directory's NOTIFY, B's pull), --rounds times.

Prints one line per build and measure (medians over the turns); asserts nothing.

    KIOSKAUTH_BIN_DIR=.build/compare/release python3 bench/fleet_helper_footprint.py \\
        --bin-dirs OLD,NEW [--repeat 3] [--rounds 20] [--syncs 50] [--settle 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fleet_support import children  # noqa: E402
from kioskauth_testing import Daemon  # noqa: E402
from test_fleet import PASSCODE, Postgres, call, form_pair, ok  # noqa: E402


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, PSS) of `pid` in KiB."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def one_turn(bin_dir: Path, args) -> dict[str, float]:
    class BuildDaemon(Daemon):
        def command(self) -> list[str]:
            return [str(bin_dir / "kioskauthd"), *super().command()[1:]]

    made: list[Daemon] = []

    def factory(**kwargs):
        d = BuildDaemon(**kwargs)
        made.append(d)
        return d

    postgres = Postgres().start()
    try:
        a, b = form_pair(factory, postgres)
        call(a, "AddPerson", name="carol")
        call(a, "SetPasscode", name="carol", passcode=PASSCODE, confirmation=PASSCODE)
        ok(a, "fleet", "sync")
        ok(b, "fleet", "sync")
        time.sleep(args.settle)
        figures: dict[str, float] = {}
        daemon_rss, daemon_pss = memory(b.proc.pid)
        helper = children(b.proc.pid)
        helper_rss, helper_pss = memory(helper[0]) if helper else (0, 0)
        figures.update({"daemon VmRSS KiB": daemon_rss, "daemon PSS KiB": daemon_pss,
                        "helper VmRSS KiB": helper_rss, "helper PSS KiB": helper_pss,
                        "daemon + helper PSS KiB": daemon_pss + helper_pss})
        syncs = []
        for _ in range(args.syncs):
            started = time.monotonic()
            reply = b.call("io.kioskauth.FleetSync")
            syncs.append((time.monotonic() - started) * 1000)
            assert "error" not in reply, reply
        figures["FleetSync p50 ms"] = statistics.median(syncs)
        figures["FleetSync p95 ms"] = percentile(syncs, 95)
        delays = []
        for round_ in range(args.rounds):
            suspend = round_ % 2 == 0
            started = time.monotonic()
            call(a, "SuspendPerson" if suspend else "ResumePerson", name="carol")
            while call(b, "GetPerson", name="carol")["parameters"]["person"]["state"] != (
                    "suspended" if suspend else "active"):
                if time.monotonic() - started > 60:
                    raise SystemExit("a change did not arrive within 60 s")
                time.sleep(0.002)
            delays.append((time.monotonic() - started) * 1000)
        figures["suspension A -> B p50 ms"] = statistics.median(delays)
        figures["suspension A -> B p95 ms"] = percentile(delays, 95)
        return figures
    finally:
        for d in made:
            d.close()
        postgres.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dirs", required=True, help="comma-separated build directories")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--syncs", type=int, default=50)
    parser.add_argument("--settle", type=float, default=3.0)
    args = parser.parse_args()
    builds = [Path(p).resolve() for p in args.bin_dirs.split(",")]
    results: dict[Path, list[dict[str, float]]] = {build: [] for build in builds}
    for turn in range(args.repeat):
        for build in builds:
            results[build].append(one_turn(build, args))
            print(f"turn {turn + 1}, {build}: done", flush=True)
    for build in builds:
        print(f"\n{build}" + (" (with kioskauth-fleet)" if (build / "kioskauth-fleet").exists() else ""))
        for key in results[build][0]:
            values = [r[key] for r in results[build]]
            print(f"  {key:28} {statistics.median(values):10.1f}   (turns: {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
