#!/usr/bin/env python3
"""How much the daemon's Argon2id working memory on transparent huge pages saves.

Compiles bench/argon2_pages.c against Sources/CArgon2/shim.h and libargon2, and runs
libargon2's own allocation and the daemon's, alternated call by call with the same inputs (the
hashes must be equal), at the default cost (64 MiB, 3 passes) unless told otherwise. Prints the
median, p90 and the ratio. Also prints the kernel's transparent huge page mode: with `never`
there is nothing to gain.

    bench/argon2_pages.py                  # 40 rounds at the default cost
    bench/argon2_pages.py --rounds 100 --memory-kib 65536 --iterations 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--memory-kib", type=int, default=64 * 1024)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        program = Path(work) / "argon2_pages"
        subprocess.run(["cc", "-O2", "-I", str(REPO / "Sources/CArgon2"), str(REPO / "bench/argon2_pages.c"),
                        "-o", str(program), "-largon2"], check=True)
        output = subprocess.run([str(program), str(args.memory_kib), str(args.iterations), str(args.rounds)],
                                check=True, capture_output=True, text=True).stdout
    times: dict[str, list[float]] = {"own": [], "huge": []}
    for line in output.splitlines():
        kind, value = line.split()
        times[kind].append(float(value))
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"transparent huge pages: {mode.read_text().strip() if mode.exists() else 'not available'}")
    print(f"Argon2id {args.memory_kib} KiB, {args.iterations} passes, 1 lane; {args.rounds} rounds, alternated")
    for kind, label in (("own", "libargon2's allocation"), ("huge", "huge-page mapping (daemon)")):
        values = times[kind]
        print(f"  {label:28} median {statistics.median(values):7.1f} ms   p90 {statistics.quantiles(values, n=10)[-1]:7.1f} ms")
    print(f"  ratio of medians (daemon / libargon2): "
          f"{statistics.median(times['huge']) / statistics.median(times['own']):.2f}")


if __name__ == "__main__":
    main()
