#!/usr/bin/python3
"""What the idle release ([Daemon] IdleReleaseSec, docs/footprint.md "Idle release") gives and
what it costs, on the build bench/compare measures (the release build as the package links it):

* idle memory: fresh copies of the binaries, daemons with libfprint's virtual reader started
  in turn with the release off (IdleReleaseSec=0) and on (the default), VmRSS, file-backed and
  anonymous resident memory and PSS 2 s after READY=1 (median of --starts each);
* the first fingerprint unlock after a release: PAM (pamtester under pam_wrapper, spawn to exit,
  pam_kioskauth mode=verify, the touch queued before each run) against one daemon with
  IdleReleaseSec=1, in turn: an unlock right after another one (no release between); one after
  its release; and one after its release and after the files it maps were dropped from the page
  cache (POSIX_FADV_DONTNEED on each; pages another process maps stay), which the kernel may do
  to unmapped pages when memory runs short; --unlocks of each; and pam_permit's floor;
* memory after the unlocks, and again once the release after them has run.

Run with Debian's Python, like bench/compare:

    /usr/bin/python3 bench/idle_release.py [--starts 5] [--unlocks 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench" / "pam"))
from pam_part import load_compare  # noqa: E402


FIGURES = ("VmRSS", "RssAnon", "RssFile", "Pss")


def drop_cache(pid: int) -> None:
    """Drops from the page cache what it holds of every file process `pid` maps, except pages some
    process maps (POSIX_FADV_DONTNEED leaves those). Prints nothing; `fincore` shows the effect."""
    from elf_residency import mapped

    for path in mapped(pid):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # deleted, or not a file
        try:
            os.fsync(fd)  # a fresh copy's pages are dirty still, and dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in FIGURES}


def show(label: str, figures: dict[str, float]) -> None:
    print(f"  {label:34} " + "  ".join(f"{key} {figures[key]:5.1f}" for key in FIGURES) + "  (MiB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--unlocks", type=int, default=20)
    args = parser.parse_args()
    compare = load_compare()
    compare.ensure_build()
    sys.path.insert(0, str(REPO / "tests"))
    from pam_support import MODULE, PamConfig, security_dir

    built = Path(os.environ["KIOSKAUTH_BIN_DIR"])
    print(f"load average before: {compare.load_average()}", flush=True)
    idle: dict[str, list[dict[str, float]]] = {"0": [], "30": []}
    for _ in range(args.starts):
        for release in idle:
            compare.fresh_copies(built)  # the same place each time: the tests' module names it once
            daemon = compare.kioskauth_daemon(fast_hash=True, idle_release=release)
            try:
                daemon.start(timeout=120)
                time.sleep(2)
                idle[release].append(compare.memory(daemon.proc.pid))
            finally:
                compare.discard(daemon)
    print(f"idle, 2 s after READY=1, virtual reader, median of {args.starts} fresh copies each:")
    show("IdleReleaseSec=0 (no release)", median_row(idle["0"]))
    show("IdleReleaseSec=30 (the default)", median_row(idle["30"]))

    work = Path(tempfile.mkdtemp(prefix="kioskauth-idle-release-"))
    work.chmod(0o755)
    world = compare.FprintdWorld(work)
    daemon = compare.kioskauth_daemon(fast_hash=True, idle_release="1")
    samples: dict[str, list[float]] = {"floor": [], "warm": [], "after a release": [],
                                       "after a release, cache dropped": []}
    try:
        compare.start_enrolled(daemon)
        config = PamConfig(Path(tempfile.mkdtemp(prefix="pam-", dir=world.root)))
        config.add("floor", f"auth required {security_dir() / 'pam_permit.so'}\n")
        config.add("finger", f"auth required {MODULE} socket={daemon.socket} mode=verify\n")

        def unlock() -> float:
            compare.touch(daemon.sensor, compare.FINGER_ID)
            return compare.pamtester(config.dir, "finger", compare.PERSON, world.env) * 1000

        unlock()  # warms what the first unlock of a daemon's life maps in
        for _ in range(args.unlocks):
            samples["floor"].append(compare.pamtester(config.dir, "floor", compare.PERSON, world.env) * 1000)
            samples["warm"].append(unlock())
            busy = compare.memory(daemon.proc.pid)
            compare.wait_for_release(daemon.proc.pid, busy["RssFile"])
            released = compare.memory(daemon.proc.pid)
            samples["after a release"].append(unlock())
            compare.wait_for_release(daemon.proc.pid, compare.memory(daemon.proc.pid)["RssFile"])
            drop_cache(daemon.proc.pid)
            samples["after a release, cache dropped"].append(unlock())
    finally:
        compare.discard(daemon)
        world.close()
    print(f"load average after: {compare.load_average()}")
    floor = statistics.median(samples["floor"])
    print(f"PAM fingerprint unlock, {args.unlocks} of each, alternated (ms):")
    for kind, values in samples.items():
        median = statistics.median(values)
        print(f"  {kind:30} median {median:7.2f}  p10 {compare.percentile(values, 0.1):7.2f}  "
              f"p90 {compare.percentile(values, 0.9):7.2f}  above the floor {median - floor:+7.2f}")
    print("the same daemon (IdleReleaseSec=1), after the last warm unlock and after the release that followed:")
    show("right after an unlock", busy)
    show("after the release that followed", released)
    return 0


if __name__ == "__main__":
    sys.exit(main())
