#!/usr/bin/python3
"""Walk-up identify latency through the real daemon, against roster size, position and layout.

Starts kioskauthd (release build by default) on libfprint's `virtual_image` driver, enrols a
roster of N people (one finger each) through the socket API, and times `Identify` from the
moment the probe image reaches the reader to the daemon's answer. The probe's owner is put at a
chosen roster position with passcode unlocks (the roster is ordered by most recent unlock):

  pos 1 .. pos 5   the caregiver is among the 5 most recent unlocks (the recency order at work)
  random           a uniformly random position inside the cap: what a person can expect
                   without the recency order
  none             a finger nobody enrolled: the whole capped roster is tried

for each identify gallery layout (`[Fingerprint] IdentifyLayout`: full, staged, compact-K).
Layouts are interleaved round by round (the daemon restarts with the next layout), so their
ratios are fair on a noisy machine. "top 5" pools positions 1-5.

Sources:
  --source synthetic --set DIR   bench/fpgen fingers (screened, distinct): every case, plus
                                 the measured impostor rate (each outsider probe vs the roster)
  --source nist --nist-set DIR   bench/fpgen `nist` copies of the NIST example prints: real
                                 ridge data, so bozorth3 costs what real prints cost.
                                 loop-right and tented_arch are probes' owners (one person
                                 each); every other roster slot is a copy of whorl or
                                 whorl-mirror; loop-right-mirror is never enrolled (the "none"
                                 probes).

Columns: latency median/p90 in ms (top 5 pools positions 1-5); "lib top5" is libfprint's
share of the top-5 cells from the daemon's own log (finger on -> match report), the rest is the
daemon's (scheduling, decoding, the store's commit, the reply); right/wrong/miss count the
genuine probes (wrong: someone else was identified); "pass 2" how many were found only by the
second pass of a two-pass layout; "FM none" the "none" probes that identified someone;
"impostor" (synthetic) every outsider's held-out touch against the roster; "direct" (--direct)
the same identify straight through libfprint in this process.

The virtual drivers simulate overheating after ~3 minutes of use, so the daemon is restarted
(a fresh libfprint context, the same store) before its scans add up to HEAT_BUDGET seconds.

  /usr/bin/python3 bench/identify_latency.py --source synthetic --set bench/out/s1
  /usr/bin/python3 bench/identify_latency.py --source nist --nist-set bench/out/nist

Compare ratios within one run: machines are shared and noisy (the load is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shown_path(path: str) -> str:
    """`path` relative to the repository when it is inside it (output lands in docs/)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return Path(path).name
os.environ.setdefault("KIOSKAUTH_BIN_DIR", str(REPO / ".build" / "release"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench" / "fpgen"))

from fprint_virtual import PrintImage, VirtualImage, environment  # noqa: E402
from kioskauth_testing import FAST_HASH_CONFIG, Daemon, connect, read_message, send_message  # noqa: E402

PASSCODE = "482913"
HEAT_BUDGET = 90.0  # seconds of scanning per daemon start (libfprint: ~180 s to overheating)
# The NIST example prints are 4 pattern types and their mirror images; arches and mirrors of one
# another score like weak genuine pairs (bench/fpgen/impressions.py), so roles go to fingers that
# do not: probes' owners, roster fillers and strangers never false-match one another.
NIST_TARGETS = ("loop-right", "tented_arch")
NIST_FILLERS = ("whorl", "whorl-mirror")
NIST_STRANGERS = ("loop-right-mirror",)
CASES = ("pos 1", "pos 2", "pos 3", "pos 4", "pos 5", "random", "none")
# The daemon's "identify finished" debug line, its metadata before or after the message
# (the journal handler and the plain one order them differently).
TIMING = re.compile(rb"(?=[^\n]*identify finished)[^\n]*pass=(\S+) [^\n]*touch_to_result_ms=(\d+)")


def gray(path: Path) -> PrintImage:
    width, height = (int(v) for v in path.name.split(".")[-2].split("x"))
    return PrintImage(path.name, width, height, path.read_bytes())


class Finger:
    """One enrollable finger: enrolment images, probe images, and which physical finger it is."""

    def __init__(self, finger_dir: Path, rec: dict, physical: str):
        self.id = rec["id"]
        self.physical = physical
        self.enrol = [gray(finger_dir / n) for n in rec["enrol"]]
        self.probes = [gray(finger_dir / n) for n in rec["probes"]]


def load_set(root: Path) -> tuple[str, list[Finger]]:
    manifest = json.loads((root / "manifest.json").read_text())
    accepted = None
    if (root / "screen.json").exists():
        accepted = set(json.loads((root / "screen.json").read_text())["accepted"])
    fingers = []
    for rec in manifest["fingers"]:
        if accepted is not None and rec["id"] not in accepted:
            continue
        fingers.append(Finger(root / rec["id"], rec, rec.get("finger", rec["id"])))
    return manifest["kind"], fingers


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Bench:
    """One daemon (restarted per layout and to cool down) and one store, for one roster size."""

    def __init__(self, cap: int):
        self.cap = cap
        self.daemon = Daemon(config=self.config("full"))
        self.sensor = self.daemon.root / "sensor.sock"
        self.daemon.extra_env.update(environment("virtual_image", self.sensor, base={}))
        self.layout = "full"
        self.scanning = 0.0
        self.daemon.start()

    def config(self, layout: str) -> str:
        return FAST_HASH_CONFIG + (
            "\n[Daemon]\nLogLevel=debug\n[Passcode]\nLockoutDelaysSec=0\n"
            f"[Fingerprint]\nIdentifyRosterCap={self.cap}\nIdentifyPauseAfter=1000\nDuplicateCheck=no\n"
            f"IdentifyLayout={layout}\n"
        )

    def use(self, layout: str):
        """Restarts the daemon with `layout` (a fresh libfprint context: cold, and nothing cached)."""
        self.layout = layout
        self.daemon.config_path.write_text(self.config(layout))
        self.daemon.restart()
        self.scanning = 0.0

    def cool_down(self, expected: float):
        if self.scanning + expected > HEAT_BUDGET:
            self.use(self.layout)

    def call(self, method: str, parameters: dict) -> dict:
        s = connect(self.daemon.socket, timeout=120)
        try:
            send_message(s, {"method": method, "parameters": parameters})
            return read_message(s)
        finally:
            s.close()

    def add(self, name: str, finger: Finger):
        r = self.call("io.kioskauth.AddPerson", {"name": name})
        assert "error" not in r, r
        r = self.call("io.kioskauth.SetPasscode", {"name": name, "passcode": PASSCODE, "confirmation": PASSCODE})
        assert "error" not in r, r
        self.cool_down(3.0)
        s = connect(self.daemon.socket, timeout=120)
        send_message(s, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name}, "more": True})
        conn = VirtualImage(self.sensor)
        touches = 0
        started = time.monotonic()
        while True:
            reply = read_message(s)
            progress = (reply.get("parameters") or {}).get("progress")
            if "error" in reply or progress is None:
                break
            if progress["state"] != "duplicate-check" and progress.get("stage", 0) < progress.get("stages", 1):
                conn.send_image(finger.enrol[touches % len(finger.enrol)])
                touches += 1
        conn.close()
        s.close()
        self.scanning += time.monotonic() - started
        if "error" in reply:
            raise RuntimeError(f"enrolment of {name} failed: {reply}")

    def unlock(self, name: str):
        """A passcode unlock: `name` becomes the most recent unlock (roster position 1)."""
        r = self.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": PASSCODE})
        assert "error" not in r, r

    def identify(self, probe: PrintImage, expected: float, hold: float = 0.0) -> tuple[float, float | None, dict]:
        """(seconds from image to answer, libfprint's share from the daemon's log, reply). With
        `hold`, the finger stays on the sensor that long after the image (as a person's does).
        `self.last_pass` is the pass over the gallery that matched ("1", "2" or "-")."""
        self.cool_down(expected + hold)
        log_start = self.daemon.log_path.stat().st_size
        s = connect(self.daemon.socket, timeout=300)
        send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        first = read_message(s)
        assert first["parameters"]["progress"]["state"] == "touch", first
        conn = VirtualImage(self.sensor)
        if hold:
            conn.automatic_finger(False)
            conn.finger(True)
        started = time.perf_counter()
        conn.send_image(probe)
        if hold:
            answered_early = bool(select.select([s], [], [], hold)[0])
            if answered_early:
                reply = read_message(s)
                elapsed = time.perf_counter() - started
                time.sleep(max(0.0, hold - elapsed))
            conn.finger(False)
            if not answered_early:
                reply = read_message(s)
                elapsed = time.perf_counter() - started
        else:
            reply = read_message(s)
            elapsed = time.perf_counter() - started
        conn.close()
        s.close()
        self.scanning += elapsed
        with open(self.daemon.log_path, "rb") as log:
            log.seek(log_start)
            found = TIMING.findall(log.read())
        self.last_pass = found[-1][0].decode() if found else "-"
        return elapsed, (int(found[-1][1]) / 1000 if found else None), reply

    def close(self):
        self.daemon.close()


class Direct:
    """The same identify straight through libfprint in this process (bench/fpgen/vimage.py): the
    roster's templates enrolled from the same images (the same minutiae), in the same order and
    layout, and the same probe. The daemon's figure minus this one is what the daemon adds."""

    def __init__(self, root: Path):
        import fpgen
        import vimage

        self.vimage = vimage
        self.fs = fpgen.FingerSet(root)
        self.readers = vimage.Readers()
        self.templates = fpgen.Templates(self.fs, self.readers, log=lambda *_: None)
        self.prints: dict[tuple[str, str], list] = {}

    def ensure(self, fingers: list[Finger]):
        self.templates.ensure([self.fs.by_id[f.id] for f in fingers])

    def identify(self, fingers: list[Finger], layout: str, probe: PrintImage) -> float:
        import nbis
        import numpy as np

        nbis_layout = {"full": "full", "staged": "staged"}.get(layout) or "k" + layout.split("-")[1]
        passes: list[list] = []
        for f in fingers:
            key = (f.id, nbis_layout)
            if key not in self.prints:
                raw = (self.templates.dir / (f.id + ".fpt")).read_bytes()
                pieces = [b for _, b in nbis.gallery([raw], nbis_layout)]
                self.prints[key] = [self.vimage.deserialize(b) for b in pieces]
            for i, p in enumerate(self.prints[key]):
                while len(passes) <= i:
                    passes.append([])
                passes[i].append(p)
        gallery = [p for ps in passes for p in ps]
        image = np.frombuffer(probe.pixels, np.uint8).reshape(probe.height, probe.width)
        return self.readers.call("identify", gallery, image, expect=len(gallery) * 0.3 + 1).wall

    def close(self):
        self.readers.close()


class Roster:
    """The bench's model of the daemon's roster order (front = tried first)."""

    def __init__(self):
        self.order: list[str] = []

    def enrolled(self, name: str):
        self.order.insert(0, name)  # nobody has unlocked: newest enrolment first

    def unlocked(self, name: str):
        self.order.remove(name)
        self.order.insert(0, name)

    def position(self, name: str) -> int:
        return self.order.index(name) + 1


def place(bench: Bench, roster: Roster, name: str, position: int, others: list[str]):
    """Puts `name` at roster `position` with passcode unlocks (`others` fill the places before it)."""
    bench.unlock(name)
    roster.unlocked(name)
    for other in others[: position - 1]:
        bench.unlock(other)
        roster.unlocked(other)
    assert roster.position(name) == position, (name, position, roster.position(name))


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_size(args, size: int, fingers: list[Finger], kind: str, rng: random.Random, log, direct=None) -> dict:
    """Enrols one roster of `size` and measures every (layout, case) cell."""
    bench = Bench(args.cap)
    window = min(size, args.cap)
    try:
        roster = Roster()
        if kind == "synthetic":
            members = fingers[:size]
            outsiders = fingers[size:]
            if not outsiders:
                raise SystemExit(f"roster {size} needs more than {len(fingers)} screened fingers")
            people = {f"p{i:03d}": f for i, f in enumerate(members)}
            targets = list(people)
        else:
            by_physical: dict[str, list[Finger]] = {}
            for f in fingers:
                by_physical.setdefault(f.physical, []).append(f)
            people = {}
            for i, physical in enumerate(NIST_TARGETS):
                people[f"t{i}-{physical}"] = by_physical[physical][0]
            copies = [f for physical in NIST_FILLERS for f in by_physical[physical]]
            rng.shuffle(copies)
            for i in range(size - len(NIST_TARGETS)):
                people[f"f{i:03d}"] = copies[i % len(copies)]
            targets = [n for n in people if n.startswith("t")]
            outsiders = [f for physical in NIST_STRANGERS for f in by_physical[physical]]
        if direct is not None:
            direct.ensure(list(people.values()))
        names = list(people)
        rng.shuffle(names)  # enrolment order
        t0 = time.monotonic()
        for name in names:
            bench.add(name, people[name])
            roster.enrolled(name)
        log(f"# roster {size}: enrolled {len(names)} in {time.monotonic() - t0:.0f} s; load {load_average()}")
        per_finger = 0.5 if kind == "nist" else 0.05  # seconds of matching per roster finger, refined below

        cells = {(layout, case): {"t": [], "lib": [], "ok": 0, "wrong": 0, "miss": 0, "fm": 0, "n": 0}
                 for layout in args.layouts for case in CASES}
        impostor = {layout: {"fm": 0, "n": 0} for layout in args.layouts}
        for rnd in range(args.repeat):
            # One plan per round, the same for every layout: (case, probe's owner, position, probe).
            plan = []
            for case in CASES:
                if case == "none":
                    stranger = outsiders[rnd % len(outsiders)]
                    plan.append((case, None, None, stranger.probes[rnd % len(stranger.probes)]))
                    continue
                target = rng.choice(targets)
                position = int(case.split()[1]) if case.startswith("pos") else rng.randint(1, window)
                plan.append((case, target, position, people[target].probes[rnd % len(people[target].probes)]))
            for layout in args.layouts:
                bench.use(layout)
                # The daemon runs for days: decode the roster once before timing (a touch by the
                # person in front), as the daemon's gallery cache would have it.
                place(bench, roster, targets[0], 1, [])
                _, _, reply = bench.identify(people[targets[0]].probes[-1], per_finger * 5 + 1)
                if ((reply.get("parameters") or {}).get("person") or {}).get("name"):
                    roster.unlocked(reply["parameters"]["person"]["name"])
                for case, target, position, probe in plan:
                    if target is not None:
                        others = [n for n in roster.order if n != target]
                        rng.shuffle(others)
                        place(bench, roster, target, position, others)
                    expected = per_finger * (position or window) * 5 + 1
                    tried = [people[n] for n in roster.order[:window]]
                    elapsed, libfprint, reply = bench.identify(probe, expected, args.hold / 1000)
                    cell = cells[(layout, case)]
                    if direct is not None:
                        cell.setdefault("direct", []).append(direct.identify(tried, layout, probe))
                    cell["n"] += 1
                    cell["t"].append(elapsed)
                    if libfprint is not None:
                        cell["lib"].append(libfprint)
                    person = ((reply.get("parameters") or {}).get("person") or {}).get("name")
                    if person:
                        roster.unlocked(person)
                    if target is None:
                        cell["fm"] += person is not None
                    elif person == target:
                        cell["ok"] += 1
                        cell["pass2"] = cell.get("pass2", 0) + (bench.last_pass == "2")
                    elif person is not None:
                        cell["wrong"] += 1
                    else:
                        cell["miss"] += 1
                    if case == "none" and libfprint:
                        per_finger = max(0.002, libfprint / window / 5)
            log(f"#   round {rnd + 1}/{args.repeat} done; load {load_average()}")
        if kind == "synthetic" and args.impostor_probes:
            # The measured impostor rate: every outsider's held-out touches against the roster.
            for layout in args.layouts:
                bench.use(layout)
                for f in outsiders:
                    for probe in f.probes[: args.impostor_probes]:
                        _, _, reply = bench.identify(probe, per_finger * window * 5 + 1)
                        person = ((reply.get("parameters") or {}).get("person") or {}).get("name")
                        impostor[layout]["n"] += 1
                        if person:
                            impostor[layout]["fm"] += 1
                            roster.unlocked(person)
        return {"cells": cells, "impostor": impostor, "window": window}
    finally:
        bench.close()


def table(args, kind: str, results: dict) -> str:
    lines = []
    head = (f"{'roster':>6} {'layout':<9} | {'top 5 med/p90':>13} | {'pos 1':>6} {'pos 5':>6} | "
            f"{'random med/p90':>14} | {'none med/p90':>13} | {'lib top5':>8} | {'right':>7} {'wrong':>5} "
            f"{'miss':>5} {'pass 2':>6} | {'FM none':>7}")
    if kind == "synthetic" and args.impostor_probes:
        head += f" | {'impostor':>9}"
    if args.direct:
        head += f" | {'direct top5/none':>16}"
    lines += [head, "-" * len(head)]

    def ms(values, q=0.5):
        return f"{1000 * percentile(values, q):.0f}" if values else "-"

    for size, res in results.items():
        for layout in args.layouts:
            c = {case: res["cells"][(layout, case)] for case in CASES}
            top5 = [t for k in CASES[:5] for t in c[k]["t"]]
            top5_lib = [t for k in CASES[:5] for t in c[k]["lib"]]
            member = [c[k] for k in CASES if k != "none"]
            right = sum(x["ok"] for x in member)
            total = sum(x["n"] for x in member)
            line = (f"{size:>6} {layout:<9} | {ms(top5):>6}/{ms(top5, 0.9):>6} | {ms(c['pos 1']['t']):>6} "
                    f"{ms(c['pos 5']['t']):>6} | {ms(c['random']['t']):>7}/{ms(c['random']['t'], 0.9):>6} | "
                    f"{ms(c['none']['t']):>6}/{ms(c['none']['t'], 0.9):>6} | {ms(top5_lib):>8} | "
                    f"{right:>3}/{total:<3} {sum(x['wrong'] for x in member):>5} {sum(x['miss'] for x in member):>5} "
                    f"{sum(x.get('pass2', 0) for x in member):>6} | "
                    f"{c['none']['fm']:>3}/{c['none']['n']:<3}")
            if kind == "synthetic" and args.impostor_probes:
                imp = res["impostor"][layout]
                line += f" | {imp['fm']:>3}/{imp['n']:<5}"
            if args.direct:
                top5_direct = [t for k in CASES[:5] for t in c[k].get("direct", [])]
                line += f" | {ms(top5_direct):>7}/{ms(c['none'].get('direct', [])):>7}"
            lines.append(line)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("synthetic", "nist"), default="synthetic")
    parser.add_argument("--set", type=Path, default=REPO / "bench" / "out" / "s1", help="synthetic set (screened)")
    parser.add_argument("--nist-set", type=Path, default=REPO / "bench" / "out" / "nist", help="fpgen.py nist copies")
    parser.add_argument("--sizes", default="10,20,40,100", type=lambda v: [int(x) for x in v.split(",")])
    parser.add_argument("--layouts", default="full,staged,compact-1", type=lambda v: v.split(","))
    parser.add_argument("--repeat", type=int, default=5, help="rounds: probes per (size, layout, case)")
    parser.add_argument("--cap", type=int, default=40, help="IdentifyRosterCap")
    parser.add_argument("--impostor-probes", type=int, default=1,
                        help="synthetic: held-out touches per outsider for the impostor rate (0: skip)")
    parser.add_argument("--hold", type=float, default=0.0,
                        help="ms a finger stays on the sensor after the image (0: lifted at once)")
    parser.add_argument("--direct", action="store_true",
                        help="also time each identify straight through libfprint (same gallery, order, layout, probe)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    kind, fingers = load_set(args.set if args.source == "synthetic" else args.nist_set)
    if kind != args.source:
        raise SystemExit(f"{args.set if args.source == 'synthetic' else args.nist_set} is a {kind} set")

    def log(message):
        print(message, file=sys.stderr, flush=True)

    print(f"# identify latency through kioskauthd ({shown_path(os.environ['KIOSKAUTH_BIN_DIR'])}), virtual_image; "
          f"source {args.source} ({len(fingers)} fingers); cap {args.cap}; {args.repeat} probes per cell; "
          f"finger held {args.hold:.0f} ms; "
          f"ms from image to answer; load at start {load_average()}")
    started = time.monotonic()
    results = {}
    direct = Direct(args.set if args.source == "synthetic" else args.nist_set) if args.direct else None
    try:
        for size in args.sizes:
            results[size] = run_size(args, size, fingers, kind, random.Random(args.seed * 1000 + size), log, direct)
            log(table(args, kind, {size: results[size]}))
    finally:
        if direct is not None:
            direct.close()
    print(table(args, kind, results))
    print(f"# {time.monotonic() - started:.0f} s; load at end {load_average()}")
    if args.json:
        args.json.write_text(json.dumps({str(size): {
            "window": res["window"], "impostor": res["impostor"],
            "cells": {f"{layout}|{case}": cell for (layout, case), cell in res["cells"].items()}}
            for size, res in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
