#!/usr/bin/env python3
"""The floor under any Swift daemon on this machine, beside C with libfprint (issue 15): what a
program that does nothing costs to start and to keep resident, before a line of kioskauth.

Builds small programs into a temporary directory (with the toolchain's swiftc and the system's
cc), starts each one, reads /proc/PID/status once it is idle, and times exec-to-exit of its
`--exit` form. Prints one row per program:

- swift-bare: `print` and `sleep` (libswiftCore, Glibc);
- swift-essentials: FoundationEssentials, Dispatch and a Task, the runtime kioskauthd's own
  modules use (dynamic), and the same with `-static-stdlib`;
- c-libfprint: C with libfprint's context made (`fp_context_new`), the library fprintd uses.

    python3 bench/runtime_floor.py [--runs 20]

VmRSS counts shared file pages too (libraries mapped by other processes are still resident
here), which is how bench/compare and docs/footprint.md count; the columns split it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rss_breakdown import status

SWIFT_BARE = """
import Glibc
if CommandLine.arguments.contains("--exit") { exit(0) }
print("ready"); fflush(stdout)
sleep(30)
"""

SWIFT_ESSENTIALS = """
import Dispatch
import FoundationEssentials
import Glibc
if CommandLine.arguments.contains("--exit") { exit(0) }
let started = Date()
DispatchQueue(label: "floor").sync { _ = started.timeIntervalSince1970 }
Task { print("ready \\(started.timeIntervalSince1970 > 0)"); fflush(stdout) }
sleep(30)
"""

C_LIBFPRINT = """
#include <fprint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--exit") == 0) return 0;
    FpContext *context = fp_context_new();
    (void)context;
    puts("ready");
    fflush(stdout);
    sleep(30);
    return 0;
}
"""


def build(work: Path) -> dict[str, Path]:
    swiftc = shutil.which("swiftc")
    if swiftc is None:
        raise SystemExit("swiftc is not on PATH")
    programs: dict[str, Path] = {}
    for name, source, flags in (("swift-bare", SWIFT_BARE, []),
                                ("swift-essentials", SWIFT_ESSENTIALS, []),
                                ("swift-essentials-static", SWIFT_ESSENTIALS, ["-static-stdlib"])):
        path = work / f"{name}.swift"
        path.write_text(source)
        subprocess.run([swiftc, "-O", *flags, str(path), "-o", str(work / name)], check=True)
        programs[name] = work / name
    c_path = work / "c-libfprint.c"
    c_path.write_text(C_LIBFPRINT)
    pkg = subprocess.run(["pkg-config", "--cflags", "--libs", "libfprint-2"], capture_output=True, text=True,
                         check=True).stdout.split()
    subprocess.run(["cc", "-O2", str(c_path), "-o", str(work / "c-libfprint"), *pkg], check=True)
    programs["c-libfprint"] = work / "c-libfprint"
    return programs


def resident(program: Path) -> dict[str, int]:
    """VmRSS and its parts (KiB) and the thread count, one second after it said ready."""
    proc = subprocess.Popen([str(program)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "FP_DRIVERS_ALLOWLIST": "virtual_device"})
    try:
        proc.stdout.readline()
        time.sleep(1)
        return {**status(proc.pid), "Threads": len(os.listdir(f"/proc/{proc.pid}/task"))}
    finally:
        proc.kill()
        proc.wait()


def exec_to_exit(program: Path, runs: int) -> float:
    """Median milliseconds from spawn to exit of `program --exit`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([str(program), "--exit"], check=True)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kioskauth-floor-") as work:
        programs = build(Path(work))
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{'program':<26}{'VmRSS KiB':>10}{'anon':>8}{'file':>8}{'threads':>9}{'exec-to-exit ms':>17}")
        for name, program in programs.items():
            status = resident(program)
            milliseconds = exec_to_exit(program, args.runs)
            print(f"{name:<26}{status['VmRSS']:>10}{status['RssAnon']:>8}{status['RssFile']:>8}"
                  f"{status['Threads']:>9}{milliseconds:>17.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
