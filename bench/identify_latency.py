#!/usr/bin/env python3
"""Walk-up identify latency through the real daemon, against roster size.

Starts kioskauthd on libfprint's `virtual_image` driver, enrols N people (one finger each) through
the socket API, and times `Identify` from the moment the probe image reaches the reader to the
daemon's answer, for the probe's finger at roster position 1 (the most recent unlock), 5, the
middle (where a random person sits without recency order), the last position inside the cap,
beyond the cap, and a finger nobody enrolled (no match: the whole capped roster is scanned).

Fingers come from the NIST example prints (their 8 distinct fingers, enrolled many times over:
realistic bozorth3 cost, so the timings are not flattered) or, with --synthetic DIR, from
bench/fpgen's generated fingers (distinct fingers: impostor rate measurable too).

The virtual drivers simulate overheating after ~3 minutes of use, so the daemon is restarted
(a fresh libfprint context, the same store) every few dozen scans.

Usage: bench/identify_latency.py [--sizes 10,20,40,100] [--repeat 5] [--synthetic DIR]
Prints a table; compare ratios within one run (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fprint_virtual import PrintImage, VirtualImage, environment, prints_directory  # noqa: E402
from kioskauth_testing import FAST_HASH_CONFIG, Daemon, connect, read_message, send_message  # noqa: E402

SCANS_PER_DAEMON = 35


class Bench:
    def __init__(self, config: str):
        self.daemon = Daemon(config=FAST_HASH_CONFIG + config)
        self.sensor = self.daemon.root / "sensor.sock"
        self.daemon.extra_env.update(environment("virtual_image", self.sensor, base={}))
        self.scans = 0
        self.daemon.start()

    def cool_down(self):
        """Fresh libfprint context before the virtual driver's heat model trips."""
        if self.scans >= SCANS_PER_DAEMON:
            self.daemon.restart()
            self.scans = 0

    def enroll(self, name: str, images: list[PrintImage]):
        self.cool_down()
        r = self.daemon.ctl("user", "add", name)
        assert r.returncode == 0, r.stderr
        s = connect(self.daemon.socket, timeout=120)
        send_message(s, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name}, "more": True})
        conn = VirtualImage(self.sensor)
        touches = 0
        while True:
            reply = read_message(s)
            progress = (reply.get("parameters") or {}).get("progress")
            if "error" in reply or progress is None:
                break
            wants = progress["state"] == "duplicate-check" and progress.get("hint", "").startswith("touch") or (
                progress["state"] != "duplicate-check" and progress.get("stage", 0) < progress.get("stages", 1))
            if wants:
                conn.send_image(images[touches % len(images)])
                touches += 1
        conn.close()
        self.scans += touches
        if "error" in reply:
            raise RuntimeError(f"enrolment of {name} failed: {reply}")

    def identify(self, probe: PrintImage) -> tuple[float, dict]:
        self.cool_down()
        s = connect(self.daemon.socket, timeout=120)
        send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        assert read_message(s)["parameters"]["progress"]["state"] == "touch"
        conn = VirtualImage(self.sensor)
        started = time.perf_counter()
        conn.send_image(probe)
        reply = read_message(s)
        elapsed = time.perf_counter() - started
        conn.close()
        self.scans += 1
        return elapsed, reply

    def close(self):
        self.daemon.close()


def nist_fingers():
    """(enrolment images, probe image) per distinct NIST finger."""
    directory = prints_directory()
    names = sorted({p.name.split(".")[0].replace("-rot", "") for p in directory.glob("*.gray")})
    fingers = []
    for name in names:
        if name.endswith("-mirror"):
            # A mirror is a different finger for NBIS; it has no second impression of its own.
            base = PrintImage.load(name)
            fingers.append(([base], base))
        else:
            fingers.append(([PrintImage.load(name)], PrintImage.load(name + "-rot")))
    return fingers


def synthetic_fingers(directory: Path):
    """(enrolment images, probe image) per finger of a bench/fpgen set (`fpgen.py generate` then
    `fpgen.py validate`): only the fingers its screening accepted, so no two match each other."""
    import json

    accepted = None
    screen = directory / "screen.json"
    if screen.exists():
        accepted = {name if isinstance(name, str) else f"f{name:04d}" for name in json.loads(screen.read_text())["accepted"]}
    fingers = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith("f")):
        if accepted is not None and folder.name not in accepted:
            continue
        enrol = [PrintImage.load(p.name.split(".")[0], folder) for p in sorted(folder.glob("enrol-*.gray"))]
        probes = sorted(folder.glob("probe-*.gray"))
        if enrol and probes:
            fingers.append((enrol, PrintImage.load(probes[0].name.split(".")[0], folder)))
    return fingers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,20,40,100")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cap", type=int, default=40)
    parser.add_argument("--synthetic", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    fingers = synthetic_fingers(args.synthetic) if args.synthetic else nist_fingers()
    distinct = len(fingers)
    print(f"# fingers: {'synthetic' if args.synthetic else 'NIST'} ({distinct} distinct); roster cap {args.cap}; "
          f"{args.repeat} probes per cell; milliseconds from image to answer")
    print(f"{'roster':>6} {'pos 1':>8} {'pos 5':>8} {'middle':>8} {'last':>8} {'no match':>9} {'impostor':>9}")
    # The last finger is never enrolled: it is the no-match probe (NIST), and synthetic sets keep
    # every finger beyond the roster as outsiders for the impostor rate.
    gallery_fingers = fingers[:-1] if not args.synthetic else fingers
    for size in sizes:
        if args.synthetic and size >= distinct:
            print(f"{size:>6} skipped: needs more than {distinct} synthetic fingers", flush=True)
            continue
        # NIST galleries repeat fingers, which the duplicate check would refuse.
        bench = Bench(f"\n[Fingerprint]\nIdentifyRosterCap={args.cap}\nIdentifyPauseAfter=1000\n"
                      f"DuplicateCheck={'yes' if args.synthetic else 'no'}\n")
        try:
            roster = []  # (name, finger index), front = tried first
            for index in range(size):
                finger = index % len(gallery_fingers)
                name = f"p{index:03d}"
                bench.enroll(name, gallery_fingers[finger][0])
                roster.insert(0, (name, finger))  # the newest enrolment is tried first

            cells = {}
            window = min(size, args.cap)
            positions = {"pos 1": 0, "pos 5": 4, "middle": window // 2, "last": window - 1}
            for label, position in positions.items():
                times = []
                for _ in range(args.repeat):
                    name, finger = roster[position]
                    # Identify returns the first match in roster order: only a finger that does
                    # not occur earlier in the roster can be timed at this position.
                    if any(f == finger for _, f in roster[:position]):
                        break
                    elapsed, reply = bench.identify(gallery_fingers[finger][1])
                    if (reply.get("parameters") or {}).get("person", {}).get("name") != name:
                        print(f"# size {size} {label}: expected {name}, got {reply}", file=sys.stderr)
                        break
                    times.append(elapsed)
                    roster.insert(0, roster.pop(position))  # the daemon moves them to the front
                cells[label] = statistics.median(times) * 1000 if times else None
            outsiders = [f[1] for f in fingers[size:]] if args.synthetic else [fingers[-1][1]]
            times, impostors = [], 0
            for attempt in range(args.repeat):
                elapsed, reply = bench.identify(outsiders[attempt % len(outsiders)])
                times.append(elapsed)
                impostors += 1 if "person" in (reply.get("parameters") or {}) else 0
            cells["no match"] = statistics.median(times) * 1000
            row = " ".join(f"{cells[k]:8.0f}" if cells.get(k) is not None else f"{'-':>8}" for k in ("pos 1", "pos 5", "middle", "last"))
            print(f"{size:>6} {row} {cells['no match']:9.0f} {f'{impostors}/{len(times)}':>9}", flush=True)
        finally:
            bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
