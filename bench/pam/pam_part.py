#!/usr/bin/python3
"""bench/compare's PAM part alone, with its own functions: pamtester under pam_wrapper, spawn to
exit, alternated run by run: pam_permit (the floor), pam_kioskauth mode=verify and pam_fprintd
with an enrolled finger on libfprint's virtual_device reader (the touch queued before each run),
and, with --other-module, a second build of pam_kioskauth against the same daemon (to compare two
builds of the module in one run). Prints the medians and the overheads above the floor.

Run with Debian's Python (python3-gi, python3-dbusmock); it builds what `bench/compare` builds
(the release build as the package links it, in .build/compare) and the PAM module:

    /usr/bin/python3 bench/pam/pam_part.py [--iterations 60] [--other-module PATH]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_compare():
    loader = importlib.machinery.SourceFileLoader("compare", str(REPO / "bench" / "compare"))
    spec = importlib.util.spec_from_loader("compare", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--other-module", type=Path, help="another pam_kioskauth.so, run against the same daemon")
    args = parser.parse_args()
    compare = load_compare()
    compare.ensure_build()
    sys.path.insert(0, str(REPO / "tests"))
    from pam_support import MODULE, PamConfig, enroll, security_dir

    work = Path(tempfile.mkdtemp(prefix="kioskauth-pam-part-"))
    work.chmod(0o755)
    print(f"load average before: {compare.load_average()}", flush=True)
    world = compare.FprintdWorld(work)
    daemon = compare.kioskauth_daemon(fast_hash=False)
    fprintd = compare.Fprintd(world, "fprintd-pam")
    person, finger = compare.PERSON, compare.FINGER_ID
    try:
        daemon.start()
        compare.varlink_calls(daemon.socket, [("AddPerson", {"name": person})])
        enroll(daemon, daemon.sensor, person, finger)
        fprintd.start()
        fprintd.enroll(person, finger)
        config = PamConfig(Path(tempfile.mkdtemp(prefix="pam-", dir=world.root)))
        config.add("floor", f"auth required {security_dir() / 'pam_permit.so'}\n")
        config.add("kioskauth-finger", f"auth required {MODULE} socket={daemon.socket} mode=verify\n")
        if args.other_module:
            config.add("other-module-finger",
                       f"auth required {args.other_module.resolve()} socket={daemon.socket} mode=verify\n")
        config.add("fprintd-finger", f"auth required {security_dir() / 'pam_fprintd.so'}\n")

        def kioskauth(service):
            return lambda: (compare.touch(daemon.sensor, finger),
                            compare.pamtester(config.dir, service, person, world.env))[1]

        runs = {"floor": lambda: compare.pamtester(config.dir, "floor", person, world.env),
                "kioskauth-finger": kioskauth("kioskauth-finger")}
        if args.other_module:
            runs["other-module-finger"] = kioskauth("other-module-finger")
        runs["fprintd-finger"] = lambda: (fprintd.touch(finger),
                                          compare.pamtester(config.dir, "fprintd-finger", person, world.env))[1]
        samples = {kind: [] for kind in runs}
        for index in range(args.warmup + args.iterations):
            for kind, run in runs.items():
                elapsed = run()
                if index >= args.warmup:
                    samples[kind].append(elapsed * 1000)
    finally:
        fprintd.stop()
        compare.discard(daemon)
        world.close()
    print(f"load average after: {compare.load_average()}")
    floor = statistics.median(samples["floor"])
    fprintd_overhead = statistics.median(samples["fprintd-finger"]) - floor
    print(f"{args.iterations} runs each, alternated (ms):")
    for kind, values in samples.items():
        median = statistics.median(values)
        line = (f"  {kind:20} median {median:7.2f}  p10 {compare.percentile(values, 0.1):7.2f}  "
                f"p90 {compare.percentile(values, 0.9):7.2f}  overhead {median - floor:+7.2f}")
        if kind not in ("floor", "fprintd-finger"):
            line += f"  ({(median - floor) / fprintd_overhead:.2f}x fprintd's)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
