#!/usr/bin/env python3
"""The live-socket fuzzer's long run: --frames (100,000) mutated varlink calls, after --warmup
(20,000), against a debug kioskauthd (.build/debug, or $KIOSKAUTH_BIN_DIR) with two people,
the per-uid rate limit raised so the unprivileged worker's frames are parsed. Prints frames,
crashes, hangs, the slowest GetStatus probe, and RSS (VmRSS and its anonymous part, RssAnon)
after the warm-up and at the end, each after 3 s of quiet; each round ends with a burst of 100
connections holding an unfinished 60,000-byte call. Repeats the fuzzing phase --rounds times on
the same daemon, printing RSS after each.

    python3 bench/socket_fuzz.py [--frames 100000] [--warmup 20000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import socket_fuzz  # noqa: E402
from kioskauth_testing import Daemon  # noqa: E402
from test_socket_fuzz import FUZZ_CONFIG  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="per role (root, nobody)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    d = Daemon(config=FUZZ_CONFIG).start()
    try:
        for name, passcode in (("sarah", "482913"), ("omar", "593024")):
            assert d.ctl("user", "add", name).returncode == 0
            assert d.ctl("passcode", "set", name, input=f"{passcode}\n{passcode}\n").returncode == 0
        for round in range(args.rounds):
            result = socket_fuzz.run(d, frames=args.frames, warmup=args.warmup if round == 0 else 0,
                                     workers_root=args.workers, workers_user=args.workers,
                                     seed=args.seed + 10 * round, log=lambda m: print(m, file=sys.stderr))
            print(json.dumps({"round": round + 1, **result}), flush=True)
            if result["crashes"]:
                print(d.log_text()[-4000:], file=sys.stderr)
                return 1
    finally:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
