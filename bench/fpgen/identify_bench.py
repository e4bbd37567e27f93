#!/usr/bin/python3
"""Identify latency of libfprint's virtual_image driver against gallery size.

One identify = one scan + libfprint's linear NBIS loop over the gallery
(5 bozorth3 comparisons per enrolled finger), stopping at the first score >=
40.  For each gallery size N and each case the probe is a held-out touch:

  first      the probe's finger is first in the gallery (recency order)
  fifth      ... fifth (a caregiver among the 5 most recent)
  random     ... at a uniformly random position (enrolment order, no recency)
  none       the probe's finger is not enrolled (the full loop runs)

Latency is wall time from the image reaching the driver to libfprint's match
report (includes mindtct on the probe).  The impostor columns count wrong
identifications in these scans, and estimate the no-match false-match rate
for N from every held-out impostor score libfprint computed in ``fpgen.py
validate`` (random galleries of N drawn from that score matrix).

Sources: ``synthetic`` (screened fpgen set, sensor profile), ``nist`` (copies
of the 8 NIST testdata fingers: real ridge data, the calibration for cost),
or synthetic galleries with a fraction of NIST copies mixed in (``--mix``).

  identify_bench.py [--sizes 10,20,40,100] [--reps 9] [--source synthetic|nist] [--mix F] [--hold MS]

With --hold the finger stays on the sensor MS after the image: libfprint reports the match at
once, but image sensors end the operation only when the finger is lifted.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import fpgen  # noqa: E402
import vimage  # noqa: E402

CASES = ("first", "fifth", "random", "none")


def expected_fmr(book, probe_ids, pool_ids, same, n, draws, rng):
    """P(a no-match probe matches someone) for galleries of n, resampled from
    libfprint's held-out score matrix.  None if the matrix lacks the pairs."""
    hits = tot = 0
    for pid in probe_ids:
        cand = [t for t in pool_ids if same[t] != same[pid]]
        if len(cand) < n:
            continue
        row = np.array([book.get(pid, t) if book.get(pid, t) is not None else -1 for t in cand])
        if (row < 0).any():
            return None
        for _ in range(draws):
            g = rng.choice(len(cand), n, replace=False)
            hits += int((row[g] >= fpgen.THRESHOLD).any())
            tot += 1
    return hits / tot if tot else None


def pct(a, q):
    return float(np.percentile(a, q)) if len(a) else float("nan")


def run(args, log=print):
    rng_master = np.random.default_rng(args.seed)
    max_n = max(args.sizes)
    nist_fs = None
    if args.source == "nist" or args.mix > 0:
        nist_root = Path(args.nist_set) if args.nist_set else fpgen.OUT / "fpgen-nist"
        variants = max(4, int(math.ceil(max_n / 7.0)) + 1)
        if (nist_root / "manifest.json").exists() and fpgen.FingerSet(nist_root).manifest.get("variants", 0) >= variants:
            nist_fs = fpgen.FingerSet(nist_root)
        else:
            nist_fs = fpgen.generate_nist(nist_root, variants, log=log)
    syn_fs = None
    if args.source == "synthetic":
        need = max_n + args.reps  # members + non-member probes
        syn_fs = fpgen.ensure_set(need, seed=args.set_seed, profile=args.profile, out=args.set, log=log)

    results = {}
    with vimage.Readers(scores=False) as readers:
        if args.source == "synthetic":
            fs = syn_fs
            pool = fs.accepted()
            t_syn = fpgen.Templates(fs, readers, log)
            t_syn.ensure(pool)
        else:
            fs = nist_fs
            pool = fs.fingers
        t_nist = None
        if nist_fs is not None:
            t_nist = fpgen.Templates(nist_fs, readers, log)
            t_nist.ensure(nist_fs.fingers)
        tget = (lambda f: t_syn.get(f.id)) if args.source == "synthetic" else (lambda f: t_nist.get(f.id))
        per_finger = 0.3 if (args.source == "nist" or args.mix > 0) else 0.02

        for n in args.sizes:
            cell = {c: {"wall": [], "cpu": [], "hit": 0, "wrong": 0, "miss": 0, "fm": 0, "trials": 0} for c in CASES}
            for r in range(args.reps):
                rng = np.random.default_rng([args.seed, n, r])
                for case in CASES:
                    if args.source == "synthetic":
                        order = rng.permutation(len(pool))
                        members = [pool[i] for i in order[:n]]
                        outsider = pool[order[n]]
                        target = outsider if case == "none" else members[rng.integers(n)]
                    else:
                        # NIST: the target is one of the 8 fingers (one copy of
                        # it enrolled); every other slot a copy of another finger.
                        names = sorted({f.finger for f in pool})
                        name = names[rng.integers(len(names))]
                        target = [f for f in pool if f.finger == name][rng.integers(sum(f.finger == name for f in pool))]
                        others = [f for f in pool if f.finger != name]
                        members = [others[i] for i in rng.permutation(len(others))[: n - (case != "none")]]
                        while len(members) < n - (case != "none"):
                            members.append(others[rng.integers(len(others))])
                        if case != "none":
                            members.insert(0, target)
                    gal_fingers = [f for f in members if f is not target]
                    if case != "none":
                        pos = {"first": 0, "fifth": min(4, n - 1), "random": int(rng.integers(n))}[case]
                        gal_fingers.insert(pos, target)
                    else:
                        pos = None
                    gallery = [tget(f) for f in gal_fingers]
                    if args.mix > 0 and args.source == "synthetic":
                        # Replace a fraction of the non-target slots by NIST copies.
                        for i in range(n):
                            if i != pos and rng.uniform() < args.mix:
                                gallery[i] = t_nist.get(nist_fs.fingers[rng.integers(len(nist_fs.fingers))].id)
                    probes = target.probe_images()
                    image = probes[r % len(probes)]
                    res = readers.call("identify", gallery, image, args.hold / 1000, expect=n * per_finger * 1.5 + 1 + args.hold / 1000)
                    if res.cpu > 0 and n >= 10:
                        per_finger = max(per_finger * 0.5, min(2.0, res.cpu / n))
                    c = cell[case]
                    c["trials"] += 1
                    c["wall"].append(res.wall)
                    c.setdefault("done", []).append(res.done)
                    c["cpu"].append(res.cpu)
                    if case == "none":
                        c["fm"] += int(res.matched)
                    elif res.index == pos:
                        c["hit"] += 1
                    elif res.matched:
                        c["wrong"] += 1
                    else:
                        c["miss"] += 1
            results[n] = cell
            log(
                "  N=%d done: %s"
                % (n, ", ".join("%s %.0f ms" % (c, 1000 * np.median(cell[c]["wall"])) for c in CASES))
            )
        contexts = readers.contexts

    # No-match false-match rate per N from the held-out score matrix.
    book = fpgen.ScoreBook(fs, "probe-0")
    same = {f.id: f.finger for f in fs.fingers}
    ids = [f.id for f in (fs.accepted() if args.source == "synthetic" else fs.fingers)]
    est = {}
    rng = np.random.default_rng(args.seed + 1)
    for n in args.sizes:
        est[n] = expected_fmr(book, ids, ids, same, n, 20, rng) if book.scores else None
    vpath = fs.root / "validate.json"
    pair = json.loads(vpath.read_text())["impostor_after" if args.source == "synthetic" else "impostor_before"] if vpath.exists() else None
    return results, est, pair, fs, contexts


def table(args, results, est, pair, fs, contexts):
    lines = []
    src = args.source if args.source == "nist" else "synthetic/%s" % fs.manifest.get("profile")
    if args.mix > 0:
        src += " + %.0f%% NIST copies" % (100 * args.mix)
    lines.append(
        "identify latency, libfprint virtual_image (bozorth3 threshold %d), source %s, %d reps per cell, %d contexts"
        % (fpgen.THRESHOLD, src, args.reps, contexts)
    )
    if pair:
        lines.append(
            "per-comparison impostor rate (held-out touches, %d comparisons): %.3f%% (95%% upper %.3f%%)"
            % (pair["comparisons"], 100 * pair["rate"], 100 * pair["rate_upper95"])
        )
    hdr = "%5s | %-15s | %-15s | %-15s | %-15s | %-8s | %-8s | %-9s | %s" % (
        "N", "first med/p90", "fifth med/p90", "random med/p90", "none med/p90", "wrong-id", "miss", "FM(none)", "FMR(N) est.",
    )
    lines.append("latency in ms (wall, image in -> match report)")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for n in args.sizes:
        cell = results[n]
        cols = []
        for c in CASES:
            w = 1000 * np.array(cell[c]["wall"])
            cols.append("%6.0f / %6.0f" % (np.median(w), pct(w, 90)))
        member_trials = sum(cell[c]["trials"] for c in CASES if c != "none")
        wrong = sum(cell[c]["wrong"] for c in CASES if c != "none")
        miss = sum(cell[c]["miss"] for c in CASES if c != "none")
        fm = cell["none"]["fm"]
        e = est.get(n)
        lines.append(
            "%5d | %s | %s | %s | %s | %3d/%-4d | %3d/%-4d | %3d/%-5d | %s"
            % (n, cols[0], cols[1], cols[2], cols[3], wrong, member_trials, miss, member_trials, fm, cell["none"]["trials"], "%.2f%%" % (100 * e) if e is not None else "n/a")
        )
    if args.hold:
        done = [t for n in args.sizes for c in CASES for t in results[n][c]["done"]]
        wall = [t for n in args.sizes for c in CASES for t in results[n][c]["wall"]]
        lines.append(
            "finger held %.0f ms: match report median %.0f ms, end of libfprint's operation median %.0f ms"
            % (args.hold, 1000 * np.median(wall), 1000 * np.median(done)))
    cpu_none = {n: 1000 * np.median(results[n]["none"]["cpu"]) for n in args.sizes}
    if len(args.sizes) >= 2:
        ns = np.array(args.sizes, float)
        slope, icpt = np.polyfit(ns, [cpu_none[n] for n in args.sizes], 1)
        lines.append("no-match CPU: %.0f ms + %.1f ms per enrolled finger (fit over N)" % (icpt, slope))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,20,40,100", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--reps", type=int, default=9, help="scans per (N, case)")
    ap.add_argument("--source", choices=("synthetic", "nist"), default="synthetic")
    ap.add_argument("--mix", type=float, default=0.0, help="fraction of non-target slots filled with NIST copies (synthetic source)")
    ap.add_argument("--set", type=Path, help="synthetic set dir (default bench/out/fpgen-PROFILE-sSEED)")
    ap.add_argument("--set-seed", type=int, default=1)
    ap.add_argument("--profile", default="sensor")
    ap.add_argument("--nist-set", type=Path)
    ap.add_argument("--seed", type=int, default=1, help="gallery/probe draws")
    ap.add_argument("--hold", type=float, default=0.0, help="ms the finger stays on the sensor after the image")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    results, est, pair, fs, contexts = run(args)
    print(table(args, results, est, pair, fs, contexts))
    print("(%.0f s)" % (time.monotonic() - t0))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "results": {str(k): v for k, v in results.items()}, "fmr_estimate": {str(k): v for k, v in est.items()}},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
