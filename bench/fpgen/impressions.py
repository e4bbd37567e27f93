#!/usr/bin/python3
"""Accuracy and cost of identify gallery layouts, from per-impression bozorth3 scores.

libfprint's NBIS templates keep one minutiae set per enrolment touch (5 on virtual_image) and
its matcher stops at the first impression scoring >= 40.  This script scores held-out touches
against every single impression of every template with libfprint itself (templates cut to one
impression with nbis.keep; scores read from libfprint's debug log), then evaluates each gallery
layout of nbis.py offline:

  genuine accept   a held-out touch matches its own finger's template (some kept impression >= 40)
  impostor/templ.  a touch matches another finger's template
  FMR(N)           a touch of a finger nobody enrolled matches someone in a gallery of N
                   (random galleries drawn from the score matrix)
  comparisons      bozorth3 comparisons per impostor template, and until the genuine match

  impressions.py score SET [--probes 0,1,2] [--fingers N] [--copies C]
  impressions.py report SET [SET...] [--sizes 10,20,40,100]

SET is an fpgen set (synthetic, screened; or `fpgen.py nist` copies, where templates of the
same physical finger are genuine).  Scores are cached in SET/impression-scores.json.
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
import nbis  # noqa: E402

THRESHOLD = fpgen.THRESHOLD
LAYOUTS = ("full", "staged", "staged:most", "best", "best:fewest", "best:median", "best:enrol", "k2", "k3")


def members(fs, copies):
    """Fingers to score: screened synthetic fingers, or the first ``copies`` copies of each NIST finger."""
    if fs.kind == "nist":
        seen = {}
        out = []
        for f in fs.fingers:
            if seen.get(f.finger, 0) < copies:
                seen[f.finger] = seen.get(f.finger, 0) + 1
                out.append(f)
        return out
    return fs.accepted()


def score(fs, probes, limit, copies, log=print):
    import vimage

    path = fs.root / "impression-scores.json"
    data = json.loads(path.read_text()) if path.exists() else {"scores": {}, "minutiae": {}}
    fingers = members(fs, copies)[:limit]
    with vimage.Readers(scores=True) as readers:
        templates = fpgen.Templates(fs, readers, log)
        templates.ensure(fingers)
        single = {}
        for f in fingers:
            raw = (templates.dir / (f.id + ".fpt")).read_bytes()
            sizes = nbis.impressions(raw)
            data["minutiae"][f.id] = sizes
            single[f.id] = [vimage.deserialize(nbis.keep(raw, [i])) for i in range(len(sizes))]
        targets = [(f.id, i) for f in fingers for i in range(len(single[f.id]))]
        t0 = time.monotonic()
        first_copy = {}
        for f in fingers:
            first_copy.setdefault(f.finger, f.id)
        for n, f in enumerate(fingers, 1):
            for k in probes:
                key = "%s/%d" % (f.id, k)
                if key in data["scores"] or k >= len(f.probes):
                    continue
                if fs.kind == "nist" and k == 0 and first_copy[f.finger] != f.id:
                    continue  # probe 0 is the real second impression: the same image for every copy
                image = f.probe_images()[k]
                row = {}
                todo = list(targets)
                while todo:
                    chunk = todo[:200]
                    res = readers.call("identify", [single[t][i] for t, i in chunk], image, expect=len(chunk) * 0.1 + 1)
                    got = res.scores
                    if len(got) != (res.index + 1 if res.matched else len(chunk)):
                        raise RuntimeError("score log out of step with identify result")
                    for (t, i), s in zip(chunk, got):
                        row.setdefault(t, [None] * len(single[t]))[i] = s
                    todo = todo[len(got):]
                data["scores"][key] = row
            if n % 10 == 0 or n == len(fingers):
                tmp = Path(str(path) + ".tmp")
                tmp.write_text(json.dumps(data))
                os.replace(tmp, path)
                log("  %d/%d fingers scored, %.0f s" % (n, len(fingers), time.monotonic() - t0))
    return data


RULES = {
    "most": lambda sizes: sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)),
    "fewest": lambda sizes: sorted(range(len(sizes)), key=lambda i: (sizes[i], i)),
    "median": lambda sizes: sorted(range(len(sizes)), key=lambda i: (abs(sizes[i] - sorted(sizes)[len(sizes) // 2]), i)),
    "enrol": lambda sizes: list(range(len(sizes))),
}


def layout_view(sizes, layout):
    """[(kept impression indices, pass)] entries one template contributes, in trial order per pass.
    ``layout`` may end in ``:RULE`` (which impressions come first; default: ``fewest`` minutiae
    for staged, as the daemon does, ``most`` for the others)."""
    layout, _, rule = layout.partition(":")
    order = RULES[rule or ("fewest" if layout == "staged" else "most")](sizes)
    if layout == "full":
        return [(list(range(len(sizes))), 0)]
    if layout == "best":
        return [(order[:1], 0)]
    if layout.startswith("k"):
        return [(order[: int(layout[1:])], 0)]
    if layout == "staged":
        return [(order[:1], 0), (order[1:], 1)]
    raise ValueError(layout)


def evaluate(fs, data, sizes_n, rng):
    same = {f.id: f.finger for f in fs.fingers}
    scores = data["scores"]
    mins = data["minutiae"]
    ids = sorted(mins)
    out = {}
    for layout in LAYOUTS:
        g_hit = g_tot = i_hit = i_tot = 0
        g_cmp, pass1 = [], 0
        for key, row in scores.items():
            pid = key.split("/")[0]
            for t, sc in row.items():
                if None in sc:
                    continue
                view = layout_view(mins[t], layout)
                kept = [i for idx, _ in view for i in idx]
                best = max(sc[i] for i in kept)
                if same[t] == same[pid]:
                    g_tot += 1
                    g_hit += best >= THRESHOLD
                    hits = [n for n, i in enumerate(kept) if sc[i] >= THRESHOLD]
                    g_cmp.append(hits[0] + 1 if hits else len(kept))
                    pass1 += any(sc[i] >= THRESHOLD for i in view[0][0])
                else:
                    i_tot += 1
                    i_hit += best >= THRESHOLD
        # FMR(N): a probe of a finger not in the gallery, galleries of N other fingers' templates.
        fmr = {}
        for n in sizes_n:
            hits = tot = 0
            for key, row in scores.items():
                pid = key.split("/")[0]
                cand = [t for t in ids if same[t] != same[pid] and t in row and None not in row[t]]
                if len(cand) < n:
                    continue
                match = np.array(
                    [max(row[t][i] for idx, _ in layout_view(mins[t], layout) for i in idx) >= THRESHOLD for t in cand]
                )
                for _ in range(40):
                    hits += int(match[rng.choice(len(cand), n, replace=False)].any())
                    tot += 1
            fmr[n] = (hits / tot) if tot else None
        k = np.mean([sum(len(idx) for idx, _ in layout_view(mins[t], layout)) for t in ids])
        first_minutiae = np.mean([mins[t][layout_view(mins[t], layout)[0][0][0]] for t in ids])
        out[layout] = {
            "genuine_accept": g_hit / g_tot if g_tot else float("nan"),
            "genuine_pairs": g_tot,
            "first_pass_accept": pass1 / g_tot if g_tot else float("nan"),
            "impostor_per_template": i_hit / i_tot if i_tot else float("nan"),
            "impostor_pairs": i_tot,
            "impostor_hits": i_hit,
            "comparisons_per_impostor": float(k),
            "genuine_comparisons_mean": float(np.mean(g_cmp)) if g_cmp else float("nan"),
            "fmr": fmr,
            "first_minutiae": float(first_minutiae),
        }
    return out


def report(sets, sizes_n, seed=1):
    lines = []
    for root in sets:
        fs = fpgen.FingerSet(root)
        path = fs.root / "impression-scores.json"
        data = json.loads(path.read_text())
        mins = [m for v in data["minutiae"].values() for m in v]
        res = evaluate(fs, data, sizes_n, np.random.default_rng(seed))
        lines.append(
            "%s (%s): %d templates, %d probes; minutiae per impression median %.0f (p10 %.0f, p90 %.0f)"
            % (fs.root.name, fs.kind, len(data["minutiae"]), len(data["scores"]), np.median(mins), np.percentile(mins, 10), np.percentile(mins, 90))
        )
        hdr = "%-11s | %-15s | %-10s | %-19s | %-8s | %-8s | %-9s | %s" % (
            "layout", "genuine accept", "1st pass", "impostor / template", "cmp/imp", "cmp/gen", "1st mins", "FMR(N) " + " ".join("N=%d" % n for n in sizes_n))
        lines += [hdr, "-" * len(hdr)]
        for layout, r in res.items():
            fmr = " ".join(("%5.1f%%" % (100 * r["fmr"][n])) if r["fmr"][n] is not None else "   n/a" for n in sizes_n)
            lines.append(
                "%-11s | %5.1f%% (%4d)   | %5.1f%%     | %6.3f%% (%d/%d) | %8.1f | %8.2f | %9.1f | %s"
                % (layout, 100 * r["genuine_accept"], r["genuine_pairs"], 100 * r["first_pass_accept"], 100 * r["impostor_per_template"], r["impostor_hits"], r["impostor_pairs"], r["comparisons_per_impostor"], r["genuine_comparisons_mean"], r["first_minutiae"], fmr)
            )
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score")
    s.add_argument("set", type=Path)
    s.add_argument("--probes", default="0", type=lambda v: [int(x) for x in v.split(",")])
    s.add_argument("--fingers", type=int, default=10**6, help="score at most this many fingers")
    s.add_argument("--copies", type=int, default=5, help="NIST sets: copies per physical finger")
    r = sub.add_parser("report")
    r.add_argument("sets", type=Path, nargs="+")
    r.add_argument("--sizes", default="10,20,40,100", type=lambda v: [int(x) for x in v.split(",")])
    a = ap.parse_args(argv)
    if a.cmd == "score":
        score(fpgen.FingerSet(a.set), a.probes, a.fingers, a.copies)
    else:
        print(report(a.sets, a.sizes))


if __name__ == "__main__":
    main()
