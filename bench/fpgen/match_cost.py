#!/usr/bin/python3
"""Where libfprint's identify time goes, per touch, on virtual_image (CPU time of this process).

For held-out touches of enrolled fingers, three identify scans of the same image:

  empty gallery            the probe's minutiae detection (mindtct) alone
  one impostor impression  + one bozorth3 comparison with another finger's impression
  one genuine impression   + one bozorth3 comparison with the finger's own impression

(the impression with the most minutiae, as the first pass of IdentifyLayout=staged tries).
With --prune M the gallery impressions are also cut to the M minutiae nearest their centroid
(nbis.prune), to see what cheaper genuine comparisons would cost in recognised touches.

  match_cost.py [--nist bench/out/nist] [--synthetic bench/out/s1] [--prune 70,55]
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import fpgen  # noqa: E402
import nbis  # noqa: E402
import vimage  # noqa: E402

# NIST fingers whose prints are not near-copies of each other (see identify_latency.py).
NIST_PROBES = ("loop-right", "tented_arch")
NIST_OTHER = "whorl"


def measure(fs, readers, targets, other, limit=None, log=print):
    templates = fpgen.Templates(fs, readers, log)
    templates.ensure(targets + [other])

    def first_pass(finger):
        raw = nbis.gallery([(templates.dir / (finger.id + ".fpt")).read_bytes()], "best")[0][1]
        return vimage.deserialize(nbis.prune(raw, limit) if limit else raw)

    impostor = first_pass(other)
    rows = []
    for finger in targets:
        own = first_pass(finger)
        for image in finger.probe_images()[:2]:
            alone = readers.call("identify", [], image, expect=2)
            imp = readers.call("identify", [impostor], image, expect=2)
            gen = readers.call("identify", [own], image, expect=2)
            rows.append((alone.cpu, imp.cpu - alone.cpu, gen.cpu - alone.cpu, gen.matched, alone.minutiae))
    a = np.array([r[:3] for r in rows]) * 1000
    return {
        "mindtct": np.median(a[:, 0]),
        "impostor": np.median(a[:, 1]),
        "genuine": np.median(a[:, 2]),
        "genuine_p90": np.percentile(a[:, 2], 90),
        "accepted": sum(r[3] for r in rows),
        "touches": len(rows),
        "probe_minutiae": np.median([r[4] for r in rows]),
    }


def count_comparisons(fs, fingers, probe, log=print):
    """bozorth3 comparisons libfprint logs for one no-match identify over ``fingers``, per layout."""
    out = {}
    with vimage.Readers(scores=True) as readers:
        templates = fpgen.Templates(fs, readers, log)
        templates.ensure(fingers)
        raws = [(templates.dir / (f.id + ".fpt")).read_bytes() for f in fingers]
        for layout in ("full", "staged", "best"):
            gallery = [vimage.deserialize(b) for _, b in nbis.gallery(raws, layout)]
            res = readers.call("identify", gallery, probe, expect=len(gallery) * 0.3 + 1)
            out[layout] = (len(res.scores), res.matched)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nist", type=Path, default=fpgen.OUT / "nist")
    ap.add_argument("--synthetic", type=Path, default=fpgen.OUT / "s1")
    ap.add_argument("--fingers", type=int, default=8, help="enrolled fingers probed per source")
    ap.add_argument("--prune", default="", type=lambda v: [int(x) for x in v.split(",") if x])
    args = ap.parse_args()
    nist, syn = fpgen.FingerSet(args.nist), fpgen.FingerSet(args.synthetic)
    sources = [
        ("NIST", nist, [f for f in nist.fingers if f.finger in NIST_PROBES][:: max(1, 30 // args.fingers)][: args.fingers],
         next(f for f in nist.fingers if f.finger == NIST_OTHER)),
        ("synthetic", syn, syn.accepted()[: args.fingers], syn.accepted()[-1]),
    ]
    stranger = next(f for f in nist.fingers if f.finger == "loop-right-mirror")
    fillers = [f for f in nist.fingers if f.finger in ("whorl", "tented_arch")][:10]
    counts = count_comparisons(nist, fillers, stranger.probe_images()[0], log=lambda *_: None)
    print("a no-match identify over %d NIST templates (5 impressions each) makes %s bozorth3 comparisons"
          % (len(fillers), ", ".join("%d (%s)" % (n, layout) for layout, (n, _) in counts.items())))
    print("CPU ms per touch (median over held-out touches): mindtct on the probe; one bozorth3 comparison")
    print("%-10s %-8s | %7s | %8s | %-19s | %s" % ("source", "gallery", "mindtct", "impostor", "genuine med/p90", "genuine accepted"))
    with vimage.Readers() as readers:
        for label, fs, targets, other in sources:
            for limit in [None] + (args.prune if label == "NIST" else []):
                r = measure(fs, readers, targets, other, limit, log=lambda *_: None)
                print("%-10s %-8s | %7.0f | %8.0f | %8.0f / %-8.0f | %d/%d (probe minutiae %.0f)" % (
                    label, "M=%d" % limit if limit else "as is", r["mindtct"], r["impostor"], r["genuine"],
                    r["genuine_p90"], r["accepted"], r["touches"], r["probe_minutiae"]), flush=True)


if __name__ == "__main__":
    main()
