#!/usr/bin/python3
"""fpgen: synthetic fingerprint sets for libfprint (virtual_image) benchmarks.

Commands (run with Debian's /usr/bin/python3: python3-numpy, python3-scipy and,
for everything that touches libfprint, gir1.2-fprint-2.0 + python3-gi):

  fpgen.py generate --count N --seed S --out DIR [--profile sensor|nist]
  fpgen.py nist --out DIR [--variants V]        # warped copies of the NIST prints
  fpgen.py validate DIR [--margin M]            # enrol, screen, held-out check
  fpgen.py calibrate DIR NISTDIR                # identify cost per enrolled finger

A set directory holds ``manifest.json`` and, per finger, ``enrol-0..4``,
``screen`` and ``probe-0..`` images as ``NAME.WxH.gray`` (raw 8-bit grey,
row-major, width a multiple of 4: the testdata format).  ``validate`` adds
``templates/`` (fp_print_serialize of each enrolment), ``scores-*.json``
(every bozorth3 score libfprint computed) and ``screen.json``/``validate.json``.
Generation is deterministic from (seed, finger index, impression), so a set
can be extended (a larger --count keeps the existing fingers) and is a cache:
keep sets under bench/out/ (git-ignored).

Module API for other bench scripts::

    import fpgen
    fs = fpgen.ensure_set(100, seed=1)        # generated, screened, cached
    for f in fs.accepted()[:20]:
        f.enrol_images()                       # 5 numpy arrays (H, W) uint8
        f.probe_images()                       # held-out touches of the finger
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the machine is shared

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import synth  # noqa: E402

REPO = HERE.parent.parent
OUT = REPO / "bench" / "out"
FORMAT = 1
ENROL = 5  # virtual_image enrols in 5 stages
THRESHOLD = 40  # libfprint's bozorth3 threshold for image devices (virtual_image)
# Screening rejects one of two fingers whose screening touches score >= MARGIN
# against each other: below THRESHOLD, so that fresh touches of accepted
# fingers rarely cross it (measured on 150 fingers: per-comparison held-out
# false matches 0.035% at margin 40, 0.013% at 34, keeping 95% / 82%).
MARGIN = 34


def nist_dir():
    """The NIST testdata prints: $FPGEN_NIST_DIR, else the repository's own copy
    in tests/data/prints."""
    env = os.environ.get("FPGEN_NIST_DIR")
    if env:
        return Path(env)
    cand = REPO / "tests" / "data" / "prints"
    if cand.is_dir():
        return cand
    raise SystemExit("NIST prints not found: set FPGEN_NIST_DIR")


# ---------------------------------------------------------------------------
# .gray files


def gray_name(stem, image):
    h, w = image.shape
    return "%s.%dx%d.gray" % (stem, w, h)


def write_gray(path, image):
    if image.dtype != np.uint8 or image.ndim != 2 or image.shape[1] % 4:
        raise ValueError("need a 2-D uint8 image with width a multiple of 4")
    tmp = Path(str(path) + ".tmp")
    image.tofile(tmp)
    os.replace(tmp, path)


def read_gray(path):
    path = Path(path)
    w, h = map(int, path.name.split(".")[-2].split("x"))
    data = np.fromfile(path, np.uint8)
    if data.size != w * h:
        raise ValueError("%s: %d bytes, expected %d" % (path, data.size, w * h))
    return data.reshape(h, w)


# ---------------------------------------------------------------------------
# sets


class Finger:
    """One enrollable finger of a set: files and identity.

    ``finger`` names the physical finger: two entries with the same ``finger``
    (NIST copies) must match each other; different ones must not.
    """

    def __init__(self, root, rec):
        self.root = root
        self.id = rec["id"]
        self.finger = rec.get("finger", self.id)
        self.cls = rec.get("class")
        self.dir = root / self.id
        self.enrol = [self.dir / n for n in rec["enrol"]]
        self.screen = self.dir / rec["screen"]
        self.probes = [self.dir / n for n in rec["probes"]]

    def enrol_images(self):
        return [read_gray(p) for p in self.enrol]

    def screen_image(self):
        return read_gray(self.screen)

    def probe_images(self):
        return [read_gray(p) for p in self.probes]

    def __repr__(self):
        return "Finger(%s)" % self.id


class FingerSet:
    def __init__(self, root):
        self.root = Path(root)
        self.manifest = json.loads((self.root / "manifest.json").read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError("%s: unknown set format" % self.root)
        self.fingers = [Finger(self.root, r) for r in self.manifest["fingers"]]
        self.by_id = {f.id: f for f in self.fingers}

    @property
    def kind(self):
        return self.manifest["kind"]

    def screen_info(self):
        p = self.root / "screen.json"
        return json.loads(p.read_text()) if p.exists() else None

    def accepted(self):
        """Fingers that passed screening (in index order); all if not screened."""
        info = self.screen_info()
        if info is None:
            return list(self.fingers)
        ok = set(info["accepted"])
        return [f for f in self.fingers if f.id in ok]


def _write_manifest(root, manifest):
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, root / "manifest.json")


def _gen_one(args):
    root, seed, index, profile, n_probes = args
    fid = "f%04d" % index
    d = Path(root) / fid
    d.mkdir(parents=True, exist_ok=True)
    m = synth.Master(seed, index, profile)
    rec = {"id": fid, "index": index, "class": m.cls, "period": round(m.base_period, 2)}
    rec["enrol"], rec["probes"] = [], []
    # Impressions: 0..4 enrolment, 5 screening probe, 6.. held-out probes.
    for k in range(ENROL + 1 + n_probes):
        img = synth.impression(m, k, enrol=k < ENROL)
        if k < ENROL:
            stem = "enrol-%d" % k
        elif k == ENROL:
            stem = "screen"
        else:
            stem = "probe-%d" % (k - ENROL - 1)
        name = gray_name(stem, img)
        write_gray(d / name, img)
        if k < ENROL:
            rec["enrol"].append(name)
        elif k == ENROL:
            rec["screen"] = name
        else:
            rec["probes"].append(name)
    return rec


def generate(out, count, seed=1, profile="sensor", probes=3, jobs=1, log=print):
    """Generate (or extend) a synthetic set; returns the FingerSet."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    mpath = root / "manifest.json"
    params = {"kind": "synthetic", "seed": seed, "profile": profile, "probes": probes, "generator": synth.VERSION}
    if mpath.exists():
        manifest = json.loads(mpath.read_text())
        old = {k: manifest.get(k) for k in params}
        if old != params:
            raise SystemExit("%s holds a set made with %s, not %s" % (root, old, params))
    else:
        manifest = dict(params, format=FORMAT, width=synth.OUT_W, height=synth.OUT_H, fingers=[])
    have = len(manifest["fingers"])
    todo = [(str(root), seed, i, profile, probes) for i in range(have, count)]
    if todo:
        t0 = time.monotonic()
        if jobs > 1:
            import multiprocessing

            with multiprocessing.Pool(jobs) as pool:
                recs = []
                for rec in pool.imap(_gen_one, todo):
                    recs.append(rec)
                    if len(recs) % 25 == 0:
                        log("  generated %d/%d" % (have + len(recs), count))
        else:
            recs = []
            for a in todo:
                recs.append(_gen_one(a))
                if len(recs) % 25 == 0:
                    log("  generated %d/%d" % (have + len(recs), count))
        manifest["fingers"].extend(recs)
        _write_manifest(root, manifest)
        log("generated %d fingers in %.0f s (%s profile, seed %d) -> %s" % (len(todo), time.monotonic() - t0, profile, seed, root))
        # A larger set invalidates an earlier screening decision.
        (root / "screen.json").unlink(missing_ok=True)
    return FingerSet(root)


NIST_FINGERS = ("arch", "loop-right", "tented_arch", "whorl")


def _nist_images(src):
    """{finger name: (image, second impression)}: the 4 NIST prints and their
    left/right mirrors (a different finger for NBIS); the second impression
    is the testdata NAME-rot image (mirrored for the mirror fingers)."""
    out = {}
    for name in NIST_FINGERS:
        base = read_gray(next(src.glob(name + ".*.gray")))
        rot = read_gray(next(src.glob(name + "-rot.*.gray")))
        out[name] = (base, rot)
        out[name + "-mirror"] = (np.ascontiguousarray(base[:, ::-1]), np.ascontiguousarray(rot[:, ::-1]))
    return out


def generate_nist(out, variants=4, seed=1, log=print):
    """NIST copies: each of the 8 NIST fingers enrolled ``variants`` times from
    warped copies of its print (same placement/distortion model as the
    synthetic impressions).  Probe 0 is the real second impression."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    src = nist_dir()
    recs = []
    for name, (base, rot) in _nist_images(src).items():
        for v in range(variants):
            fid = "%s~%d" % (name, v)
            d = root / fid
            d.mkdir(exist_ok=True)
            rec = {"id": fid, "finger": name, "class": name.split("-")[0], "enrol": [], "probes": []}
            for k in range(ENROL):
                img = synth.warp_real(base, seed, v * 16 + k)
                rec["enrol"].append(gray_name("enrol-%d" % k, img))
                write_gray(d / rec["enrol"][-1], img)
            img = synth.warp_real(base, seed, v * 16 + ENROL)
            rec["screen"] = gray_name("screen", img)
            write_gray(d / rec["screen"], img)
            rec["probes"].append(gray_name("probe-0", rot))
            write_gray(d / rec["probes"][-1], rot)
            img = synth.warp_real(rot, seed, v * 16 + ENROL + 1)
            rec["probes"].append(gray_name("probe-1", img))
            write_gray(d / rec["probes"][-1], img)
            recs.append(rec)
    manifest = {"format": FORMAT, "kind": "nist", "seed": seed, "variants": variants, "fingers": recs}
    _write_manifest(root, manifest)
    log("wrote %d NIST copies (%d fingers x %d) -> %s" % (len(recs), len(recs) // variants, variants, root))
    return FingerSet(root)


# ---------------------------------------------------------------------------
# libfprint side (imports gi lazily: generation works without it)


def _vimage():
    import vimage

    return vimage


class Templates:
    """Enrolled templates of a set, cached in DIR/templates (serialized FpPrint)."""

    def __init__(self, fs, readers, log=print):
        self.fs, self.readers, self.log = fs, readers, log
        self.dir = fs.root / "templates"
        self.dir.mkdir(exist_ok=True)
        ipath = self.dir / "index.json"
        self.index = json.loads(ipath.read_text()) if ipath.exists() else {}
        self._prints = {}

    def _save_index(self):
        tmp = self.dir / "index.json.tmp"
        tmp.write_text(json.dumps(self.index))
        os.replace(tmp, self.dir / "index.json")

    def ensure(self, fingers):
        vimage = _vimage()
        todo = [f for f in fingers if f.id not in self.index or not (self.dir / (f.id + ".fpt")).exists()]
        t0 = time.monotonic()
        for n, f in enumerate(todo, 1):
            prt, mins, retries = self.readers.call("enroll", f.enrol_images(), expect=5.0)
            (self.dir / (f.id + ".fpt")).write_bytes(vimage.serialize(prt))
            self.index[f.id] = {"minutiae": mins, "retries": retries}
            self._prints[f.id] = prt
            if n % 50 == 0:
                self._save_index()
                self.log("  enrolled %d/%d" % (n, len(todo)))
        if todo:
            self._save_index()
            self.log("enrolled %d fingers in %.0f s" % (len(todo), time.monotonic() - t0))

    def get(self, fid):
        if fid not in self._prints:
            self._prints[fid] = _vimage().deserialize((self.dir / (fid + ".fpt")).read_bytes())
        return self._prints[fid]

    def minutiae(self, fid):
        return self.index[fid]["minutiae"]


class ScoreBook:
    """bozorth3 scores of (probe finger, template finger) pairs for one kind of
    probe ("screen" or "probe-0"), persisted as JSON so sweeps resume."""

    def __init__(self, fs, kind):
        self.path = fs.root / ("scores-%s.json" % kind)
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {"scores": {}, "cpu": []}
        self.scores = self.data["scores"]

    def get(self, p, t):
        return self.scores.get(p, {}).get(t)

    def put(self, p, t, s):
        self.scores.setdefault(p, {})[t] = s

    def save(self):
        tmp = Path(str(self.path) + ".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def sweep(fs, templates, readers, book, probe_of, fingers, log=print, chunk_seconds=20.0):
    """Score every probe (``probe_of(finger)``) against every template of
    ``fingers`` with libfprint identify scans: one scan covers a whole chunk of
    the gallery; libfprint stops at the first score >= threshold, so the scan
    is repeated on the rest of the chunk.  The finger's own template goes
    last (its score is the genuine score).  Only missing pairs are scanned."""
    vimage = _vimage()
    per_template = 0.3  # seconds (a NIST-like template), refined from measurements
    t0 = time.monotonic()
    scans = 0
    ids = [f.id for f in fingers]
    for n, f in enumerate(fingers, 1):
        todo = [t for t in ids if t != f.id and book.get(f.id, t) is None]
        if book.get(f.id, f.id) is None:
            todo.append(f.id)
        if not todo:
            continue
        image = probe_of(f)
        while todo:
            size = max(1, min(len(todo), int(chunk_seconds / per_template)))
            chunk = todo[:size]
            res = readers.call("identify", [templates.get(t) for t in chunk], image, expect=size * per_template * 1.5 + 1)
            scans += 1
            best = vimage.template_scores(res.scores, len(chunk), ENROL)
            done = 0
            for t, s in zip(chunk, best):
                if s is None:
                    break
                book.put(f.id, t, s)
                done += 1
            if res.matched:
                if res.index != done - 1:
                    raise RuntimeError("score log out of step with identify result")
            elif done != len(chunk):
                raise RuntimeError("missing scores: is libfprint's debug log reaching the tap?")
            # CPU per template compared (includes the probe's mindtct: an upper bound).
            cost = res.cpu / done
            book.data["cpu"].append([done, round(res.cpu, 4)])
            per_template = 0.7 * per_template + 0.3 * max(cost, 0.001) if scans > 1 else max(cost, 0.001)
            todo = todo[done:]
        if n % 10 == 0:
            book.save()
            el = time.monotonic() - t0
            log("  %s: %d/%d probes, %d scans, %.0f s" % (book.path.stem, n, len(fingers), scans, el))
    book.save()


def _greedy_screen(ids, conflicts):
    """Drop fingers until no conflict edge is left: most-conflicted first."""
    adj = {i: set() for i in ids}
    for a, b in conflicts:
        adj[a].add(b)
        adj[b].add(a)
    rejected = []
    while True:
        worst = max(ids, key=lambda i: (len(adj[i]), ids.index(i)))
        if not adj[worst]:
            break
        for j in adj[worst]:
            adj[j].discard(worst)
        adj[worst] = set()
        rejected.append(worst)
        ids = [i for i in ids if i != worst]
    return rejected


def screen(fs, readers, margin=MARGIN, log=print):
    """Screen ``fs``: a finger is rejected if its screening touch does not
    match its own template (score < THRESHOLD), and of any two fingers whose
    screening touches score >= ``margin`` against the other's template, the
    one with more such conflicts goes.  Writes screen.json."""
    templates = Templates(fs, readers, log)
    templates.ensure(fs.fingers)
    book = ScoreBook(fs, "screen")
    sweep(fs, templates, readers, book, lambda f: f.screen_image(), fs.fingers, log)
    ids = [f.id for f in fs.fingers]
    same = {f.id: f.finger for f in fs.fingers}
    bad_genuine = [i for i in ids if book.get(i, i) < THRESHOLD]
    conflicts = []
    for a in ids:
        for b in ids:
            if a < b and same[a] != same[b]:
                s = max(book.get(a, b), book.get(b, a))
                if s >= margin:
                    conflicts.append((a, b))
    pool = [i for i in ids if i not in bad_genuine]
    rejected = _greedy_screen(pool, [(a, b) for a, b in conflicts if a in pool and b in pool])
    accepted = [i for i in pool if i not in rejected]
    info = {
        "threshold": THRESHOLD,
        "margin": margin,
        "count": len(ids),
        "accepted": accepted,
        "rejected_conflict": rejected,
        "rejected_genuine": bad_genuine,
        "conflicts": [[a, b, max(book.get(a, b), book.get(b, a))] for a, b in conflicts],
    }
    (fs.root / "screen.json").write_text(json.dumps(info, indent=1))
    log(
        "screening (margin %d): %d of %d accepted; %d conflict pairs, %d rejected for conflicts, %d for a failed own match"
        % (margin, len(accepted), len(ids), len(conflicts), len(rejected), len(bad_genuine))
    )
    return info


def _pct(a, q):
    return float(np.percentile(a, q)) if len(a) else float("nan")


def impostor_stats(book, fingers, same):
    """Per directed comparison (probe of a, template of b, different fingers)."""
    sc = []
    for a in fingers:
        for b in fingers:
            if same[a] != same[b]:
                s = book.get(a, b)
                if s is not None:
                    sc.append(s)
    sc = np.array(sc)
    n = len(sc)
    fm = int((sc >= THRESHOLD).sum())
    # Wilson 95% upper bound for the rate (meaningful when fm == 0).
    z = 1.96
    p = fm / n if n else 0.0
    upper = (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n) if n else float("nan")
    return {
        "comparisons": n,
        "false_matches": fm,
        "rate": p,
        "rate_upper95": upper,
        "mean": float(sc.mean()) if n else float("nan"),
        "p99": _pct(sc, 99),
        "max": int(sc.max()) if n else None,
        "ge30": float((sc >= 30).mean()) if n else float("nan"),
    }


def validate(fs, margin=MARGIN, log=print):
    """Screen, then check with held-out touches (probe-0) through libfprint."""
    vimage = _vimage()
    with vimage.Readers(scores=True) as readers:
        info = screen(fs, readers, margin, log)
        templates = Templates(fs, readers, log)
        book = ScoreBook(fs, "probe-0")
        sweep(fs, templates, readers, book, lambda f: f.probe_images()[0], fs.fingers, log)
        contexts = readers.contexts
    same = {f.id: f.finger for f in fs.fingers}
    all_ids = [f.id for f in fs.fingers]
    acc = info["accepted"]
    genuine = np.array([book.get(i, i) for i in acc])
    # Every template sharing the probe's finger counts as genuine (NIST copies).
    mins = [m for i in all_ids for m in templates.minutiae(i)]
    cpu = np.array([c / d for d, c in ScoreBook(fs, "probe-0").data["cpu"] if d >= 10] or [np.nan])
    res = {
        "set": str(fs.root),
        "kind": fs.kind,
        "profile": fs.manifest.get("profile"),
        "fingers": len(all_ids),
        "accepted": len(acc),
        "margin": margin,
        "genuine_accept_rate": float((genuine >= THRESHOLD).mean()) if len(genuine) else float("nan"),
        "genuine_score": {"min": int(genuine.min()), "median": float(np.median(genuine))} if len(genuine) else None,
        "impostor_before": impostor_stats(book, all_ids, same),
        "impostor_after": impostor_stats(book, acc, same),
        "screen_impostor_before": impostor_stats(ScoreBook(fs, "screen"), all_ids, same),
        "minutiae": {"median": float(np.median(mins)), "p10": _pct(mins, 10), "p90": _pct(mins, 90)},
        "cpu_per_template_ms": 1000 * float(np.median(cpu)),
        "contexts": contexts,
    }
    (fs.root / "validate.json").write_text(json.dumps(res, indent=1))
    ib, ia = res["impostor_before"], res["impostor_after"]
    log("validate %s (%s, %s profile)" % (fs.root, fs.kind, res["profile"]))
    log("  fingers %d, accepted after screening %d (margin %d)" % (res["fingers"], res["accepted"], margin))
    log(
        "  genuine accept rate (held-out touch vs own 5-touch template): %.1f%% (%d/%d), score min %s median %s"
        % (100 * res["genuine_accept_rate"], int((genuine >= THRESHOLD).sum()), len(genuine), res["genuine_score"]["min"], res["genuine_score"]["median"])
    )
    for label, st in (("before screening", ib), ("after screening", ia)):
        log(
            "  impostor per comparison %s: %d/%d = %.3f%% (95%% upper %.3f%%); score mean %.1f p99 %.0f max %s; >=30: %.2f%%"
            % (label, st["false_matches"], st["comparisons"], 100 * st["rate"], 100 * st["rate_upper95"], st["mean"], st["p99"], st["max"], 100 * st["ge30"])
        )
    log("  minutiae per enrolment touch (libfprint mindtct): median %.0f (p10 %.0f, p90 %.0f)" % (res["minutiae"]["median"], res["minutiae"]["p10"], res["minutiae"]["p90"]))
    log("  identify CPU per enrolled finger (5 bozorth3 comparisons, incl. probe mindtct share): %.1f ms" % res["cpu_per_template_ms"])
    return res


def calibrate(fs_syn, fs_nist, n_big=30, probes=12, log=print):
    """Identify cost per enrolled finger, synthetic vs NIST copies.

    For each of ``probes`` probe touches, a no-match identify over 1 and over
    ``n_big`` enrolled fingers; the difference / (n_big - 1) is the cost of
    one enrolled finger (5 bozorth3 comparisons) for that probe, free of the
    fixed cost (the probe's mindtct, the scan itself).
    """
    vimage = _vimage()
    out = {}
    with vimage.Readers(scores=False) as readers:
        ts, tn = Templates(fs_syn, readers, log), Templates(fs_nist, readers, log)
        syn = fs_syn.accepted()
        nist = fs_nist.fingers
        ts.ensure(syn[: n_big + probes])
        tn.ensure(nist)
        names = sorted({f.finger for f in nist})
        for label in ("synthetic", "nist"):
            per, fixed, fixed_wall, per_wall, pmins, fms = [], [], [], [], [], 0
            for p in range(probes):
                if label == "synthetic":
                    probe = syn[n_big + p] if len(syn) > n_big + p else syn[-1 - p]
                    pool = [f for f in syn if f.id != probe.id]
                    img = probe.probe_images()[0]
                    tget = ts.get
                else:
                    name = names[p % len(names)]
                    probe = next(f for f in nist if f.finger == name)
                    pool = [f for f in nist if f.finger != name]
                    img = probe.probe_images()[0]
                    tget = tn.get
                gal = [tget(pool[i % len(pool)].id) for i in range(n_big)]
                small = readers.call("identify", gal[:1], img, expect=2)
                big = readers.call("identify", gal, img, expect=n_big * 0.6 + 1)
                per.append((big.cpu - small.cpu) / (n_big - 1))
                per_wall.append((big.wall - small.wall) / (n_big - 1))
                fixed.append(small.cpu)
                fixed_wall.append(small.wall)
                pmins.append(big.minutiae)
                fms += int(big.matched)
            tmpl = syn[:n_big] if label == "synthetic" else nist
            tm = ts if label == "synthetic" else tn
            mins = [m for f in tmpl for m in tm.minutiae(f.id)]
            out[label] = {
                "cpu_per_finger_ms": 1000 * float(np.median(per)),
                "cpu_per_finger_ms_each_probe": [round(1000 * x, 1) for x in per],
                "wall_per_finger_ms": 1000 * float(np.median(per_wall)),
                "fixed_cpu_ms": 1000 * float(np.median(fixed)),
                "fixed_wall_ms": 1000 * float(np.median(fixed_wall)),
                "template_minutiae_median": float(np.median(mins)),
                "probe_minutiae": pmins,
                "false_matches": fms,
            }
            o = out[label]
            log(
                "  %-9s per enrolled finger: CPU %.1f ms (per probe: %s), wall %.1f ms; one-finger scan: CPU %.0f ms, wall %.0f ms; minutiae per touch %.0f, probes %s"
                % (label, o["cpu_per_finger_ms"], o["cpu_per_finger_ms_each_probe"], o["wall_per_finger_ms"], o["fixed_cpu_ms"], o["fixed_wall_ms"], o["template_minutiae_median"], pmins)
            )
    ratio = out["nist"]["cpu_per_finger_ms"] / out["synthetic"]["cpu_per_finger_ms"]
    out["nist_over_synthetic"] = ratio
    log("  a NIST template costs %.1fx a synthetic one per enrolled finger (median over probes)" % ratio)
    (fs_syn.root / "calibrate.json").write_text(json.dumps(out, indent=1))
    return out


def default_set_dir(seed=1, profile="sensor"):
    return OUT / ("fpgen-%s-s%d" % (profile, seed))


def ensure_set(count, seed=1, profile="sensor", out=None, margin=MARGIN, jobs=1, log=print):
    """A screened synthetic set with at least ``count`` accepted fingers,
    generated and screened as needed (cached under bench/out/)."""
    root = Path(out) if out else default_set_dir(seed, profile)
    total = int(math.ceil(count * 1.15)) + 5
    if (root / "manifest.json").exists():
        total = max(total, len(FingerSet(root).fingers))
    while True:
        fs = generate(root, total, seed, profile, jobs=jobs, log=log)
        info = fs.screen_info()
        if info is None or info["margin"] != margin:
            with _vimage().Readers(scores=True) as readers:
                info = screen(fs, readers, margin, log)
        got = len(info["accepted"])
        if got >= count:
            return FingerSet(root)
        rate = max(got / len(fs.fingers), 0.3)
        total = max(int(math.ceil(count / rate * 1.05)) + 5, len(fs.fingers) + 1)


# ---------------------------------------------------------------------------
# CLI


def main(argv=None):
    ap = argparse.ArgumentParser(prog="fpgen.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate (or extend) a synthetic set")
    g.add_argument("--count", type=int, required=True)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--out", type=Path, help="default: bench/out/fpgen-PROFILE-sSEED")
    g.add_argument("--profile", choices=sorted(synth.PROFILES), default="sensor")
    g.add_argument("--probes", type=int, default=3, help="held-out touches per finger")
    g.add_argument("--jobs", type=int, default=1)
    n = sub.add_parser("nist", help="write warped copies of the NIST testdata prints as a set")
    n.add_argument("--out", type=Path, default=OUT / "fpgen-nist")
    n.add_argument("--variants", type=int, default=4)
    n.add_argument("--seed", type=int, default=1)
    v = sub.add_parser("validate", help="enrol, screen and check a set with libfprint")
    v.add_argument("dir", type=Path)
    v.add_argument("--margin", type=int, default=MARGIN, help="screening rejects pairs scoring >= this (default %d)" % MARGIN)
    c = sub.add_parser("calibrate", help="identify cost per enrolled finger: synthetic vs NIST copies")
    c.add_argument("dir", type=Path)
    c.add_argument("nistdir", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        generate(a.out or default_set_dir(a.seed, a.profile), a.count, a.seed, a.profile, a.probes, a.jobs)
    elif a.cmd == "nist":
        generate_nist(a.out, a.variants, a.seed)
    elif a.cmd == "validate":
        validate(FingerSet(a.dir), a.margin)
    elif a.cmd == "calibrate":
        calibrate(FingerSet(a.dir), FingerSet(a.nistdir))


if __name__ == "__main__":
    main()
