#!/usr/bin/env python3
"""Crash consistency under SIGKILL: the long run of tests/crash_torture.py.

Each iteration starts a debug kioskauthd (.build/debug, or $KIOSKAUTH_BIN_DIR) on the same store,
lets a few admin clients add people, set passcodes, activate people with their codes, issue new
codes, type wrong passcodes and remove people, kills the daemon with SIGKILL at a random moment,
restarts it and checks every acknowledged write, that the audit trail replays to exactly the
people the store holds (existence, passcode, state), that every acknowledged write has its audit
entry, and that the chain verifies. Prints the figures; exits 1 when anything was lost or
mismatched.

    python3 bench/crash_consistency.py [--iterations 300] [--seed 1] [--workers 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from crash_torture import run  # noqa: E402
from kioskauth_testing import KIOSKAUTHD, Daemon  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    if not KIOSKAUTHD.exists():
        print(f"{KIOSKAUTHD} is not built (run swift build first)", file=sys.stderr)
        return 2
    daemon = Daemon()
    started = time.monotonic()

    def progress(figures):
        if figures.iterations % 25 == 0:
            print(f"  ... {figures.line()}", file=sys.stderr, flush=True)

    try:
        figures = run(daemon, iterations=args.iterations, seed=args.seed, workers=args.workers, progress=progress)
    finally:
        daemon.close()
    print(f"{figures.line()} seconds={time.monotonic() - started:.0f}")
    for problem in figures.problems[:20]:
        print("  " + problem)
    return 0 if (figures.lost, figures.audit_mismatches, figures.chain_broken) == (0, 0, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
