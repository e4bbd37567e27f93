"""Synthetic fingerprints, SFinGe-style (numpy + scipy only).

A *master finger* is a ridge pattern grown by iterative, space-variant Gabor
filtering from a few random seeds (SFinGe: Cappelli, Maio, Maltoni), steered by

* an orientation field from the Sherlock-Monro zero-pole model (cores are
  poles, deltas are zeros) for the loop / whorl / tented-arch classes, and a
  smooth arch function for plain arches, plus smooth random perturbations at
  two scales so that fingers of one class differ (see orientation_field);
* a ridge-period field: a per-finger base period, times the relative period
  that lets ridges follow the class flow without inserting all new ridges on
  one line (see flow_period), times a smooth random variation.

An *impression* of a master is: rotation (<= 10 deg), translation, a
non-linear (elastic) skin distortion, a finger-shaped contact region whose
size follows the pressure, ridge thickness from the pressure, dry patches,
uneven illumination, blur and sensor noise.  Dark ridges on a light
background, 8-bit grey, OUT_W x OUT_H.

Everything is deterministic from (seed, finger index, impression index) and
the profile, whatever the order or number of fingers generated.
"""

import math

import numpy as np
from scipy import fft as sfft
from scipy import ndimage

# Profiles.  period: base ridge period range in finger pixels (500 dpi);
# scale: finger pixels per output pixel; silhouette: finger size factor.
# "sensor" is a 500 dpi press sensor: ridge period ~9 px, the 256x256 frame
# (13 mm) inside the fingertip, ~40 minutiae.  "nist" looks like the NIST
# example prints in testdata: the whole (rolled) fingertip in the frame,
# ridge period ~5 px, ~90 minutiae -- and bozorth3 cost to match.
PROFILES = {
    "sensor": {"period": (8.3, 9.8), "scale": 1.0, "silhouette": 1.0, "seeds": (12, 30), "noise": (6.0, 14.0)},
    "nist": {"period": (8.3, 9.8), "scale": 1.75, "silhouette": 1.65, "seeds": (12, 30), "noise": (8.0, 18.0)},
}

CLASSES = (  # NIST-like class frequencies
    ("loop_r", 0.32),
    ("loop_l", 0.33),
    ("whorl", 0.26),
    ("tented", 0.05),
    ("arch", 0.04),
)

VERSION = 1  # bump when the output for a given (seed, index, k) changes

OUT_W = 256  # multiple of 4, as the virtual_image wire format wants
OUT_H = 256

_N_ORI = 16  # orientation bins of the Gabor bank


# ---------------------------------------------------------------------------
# fields


def _smooth_noise(rng, n, scale, amp):
    """Zero-mean smooth random field (n x n) with std ``amp``, correlation ``scale`` px.

    White noise through a Gaussian low-pass of std ``scale`` (periodic), in
    the Fourier domain so that large scales stay cheap.
    """
    fy = np.fft.fftfreq(n)[:, None]
    fx = np.fft.rfftfreq(n)[None, :]
    lp = np.exp(-2.0 * (math.pi * scale) ** 2 * (fx * fx + fy * fy))
    f = sfft.irfft2(sfft.rfft2(rng.standard_normal((n, n))) * lp, s=(n, n))
    f -= f.mean()
    f /= f.std() + 1e-12
    return f * amp


def _grid(n, step):
    """Finger coordinates (x, y) of an n x n grid with ``step`` px per cell."""
    c = (n - 1) / 2.0
    y, x = np.mgrid[0:n, 0:n].astype(np.float64)
    return (x - c) * step, (y - c) * step


def orientation_field(rng, cls, n, step):
    """Ridge orientation (radians, mod pi), the same without the individual
    perturbation (the class field), and the singular points.

    Image coordinates: x right, y down; the finger tip is up (small y).
    """
    x, y = _grid(n, step)
    z = x + 1j * y
    cores, deltas = [], []
    # Positions relative to the canvas centre (px, 500 dpi scale).
    jx = lambda s: rng.normal(0, s)  # noqa: E731
    if cls in ("loop_r", "loop_l"):
        sgn = 1 if cls == "loop_r" else -1
        core = complex(jx(15), -25 + jx(15))
        delta = core + complex(sgn * rng.uniform(70, 120), rng.uniform(90, 140))
        cores, deltas = [core], [delta]
    elif cls == "whorl":
        c0 = complex(jx(15), -25 + jx(15))
        sep = rng.uniform(22, 40)
        ang = rng.uniform(-0.9, 0.9)
        c1 = c0 + sep * complex(math.sin(ang), math.cos(ang))
        cores = [c0, c1]
        base = (c0 + c1) / 2
        deltas = [
            base + complex(-rng.uniform(90, 140), rng.uniform(80, 130)),
            base + complex(rng.uniform(90, 140), rng.uniform(80, 130)),
        ]
    elif cls == "tented":
        core = complex(jx(12), -20 + jx(15))
        delta = core + complex(jx(8), rng.uniform(45, 75))
        cores, deltas = [core], [delta]

    if cls == "arch":
        # Ridges run left-right, bulging up around a random centre.
        cx = jx(20)
        cy = rng.uniform(0, 60)
        k = rng.uniform(0.8, 1.5)
        w = rng.uniform(70, 110)
        theta = -np.arctan(k * (x - cx) / w * np.exp(-((x - cx) ** 2) / (2 * w * w)) * np.exp(-np.maximum(y - cy, 0) / 150))
        theta = theta * np.clip(1.0 - (cy - y) / 300.0, 0.3, 1.0)
    else:
        theta = np.zeros_like(x)
        for c in cores:
            theta += 0.5 * np.angle(z - c)
        for d in deltas:
            theta -= 0.5 * np.angle(z - d)
        # Ridges horizontal above the pattern (towards the finger tip).
        ref = complex(0, -400)
        theta -= 0.5 * sum(np.angle(ref - c) for c in cores) - 0.5 * sum(np.angle(ref - d) for d in deltas)
    # Individuality: smooth perturbation, smaller next to singular points.
    # The fine-scale term (20 px, 0.2 rad) matters for bozorth3: without it
    # minutiae directions follow the class-typical flow so closely that
    # different fingers score >= 40 against each other in ~1% of comparisons.
    pert = _smooth_noise(rng, n, 20 / step, 0.20) + _smooth_noise(rng, n, 90 / step, 0.30)
    damp = np.ones_like(x)
    for p in cores + deltas:
        damp *= 1.0 - np.exp(-np.abs(z - p) ** 2 / (2 * 12.0**2))
    base = np.mod(theta, np.pi)
    theta = theta + pert * damp
    return np.mod(theta, np.pi), base, cores, deltas


def flow_period(theta, cores, deltas, step, lam=0.3, clip=(0.85, 1.3), coarse=4):
    """Relative ridge period that lets ridges follow ``theta`` with few insertions.

    A stripe pattern with wave vector k*n (n = unit normal to the ridges) has
    no minutiae where curl(k n) = 0, i.e. where log k changes along the ridges
    as  u . grad(log k) = -n . grad(theta)  (u = ridge direction): ridges that
    fan out must also spread apart.  Solved in the least-squares sense, with a
    little smoothness across ridges and less weight next to singular points.
    Without it the Gabor growth inserts every ridge the flow demands along
    one line ("ladders" of equally spaced minutiae), which bozorth3 matches
    across different fingers.
    """
    from scipy import sparse
    from scipy.sparse import linalg as splinalg

    # The result is smooth: solve on a grid ``coarse`` times coarser.
    full = theta.shape[0]
    c2 = np.cos(2 * theta).reshape(full // coarse, coarse, -1, coarse).mean(axis=(1, 3))
    s2 = np.sin(2 * theta).reshape(full // coarse, coarse, -1, coarse).mean(axis=(1, 3))
    theta = 0.5 * np.arctan2(s2, c2) % np.pi
    step = step * coarse
    n = theta.shape[0]
    c2, s2 = np.cos(2 * theta), np.sin(2 * theta)
    gy_c, gx_c = np.gradient(c2)
    gy_s, gx_s = np.gradient(s2)
    tx = 0.5 * (c2 * gx_s - s2 * gx_c)  # d theta / dx (per cell), mod-pi safe
    ty = 0.5 * (c2 * gy_s - s2 * gy_c)
    ux, uy = np.cos(theta), np.sin(theta)
    g = -(-uy * tx + ux * ty)  # -(n . grad theta), n = (-sin, cos)
    x, y = _grid(n, step)
    z = x + 1j * y
    w = np.ones((n, n))
    for p in list(cores) + list(deltas):
        w *= np.clip(np.abs(z - p) / 30.0, 0.05, 1.0)
    g = np.clip(g, -0.3, 0.3)
    N = n * n
    idx = np.arange(N).reshape(n, n)

    def d_op(axis):
        # central difference along axis (one-sided at the borders)
        rows, cols, vals = [], [], []
        for i in range(n):
            lo, hi = max(i - 1, 0), min(i + 1, n - 1)
            if axis == 1:
                a, b = idx[:, hi], idx[:, lo]
                r = idx[:, i]
            else:
                a, b = idx[hi, :], idx[lo, :]
                r = idx[i, :]
            inv = 1.0 / (hi - lo)
            rows += [r, r]
            cols += [a, b]
            vals += [np.full(n, inv), np.full(n, -inv)]
        return sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(N, N))

    Dx, Dy = d_op(1), d_op(0)
    W = sparse.diags(w.ravel())
    A_flow = W @ (sparse.diags(ux.ravel()) @ Dx + sparse.diags(uy.ravel()) @ Dy)
    A_smooth = lam * sparse.vstack([Dx, Dy])
    A_pin = sparse.identity(N) * 0.02
    A = sparse.vstack([A_flow, A_smooth, A_pin]).tocsr()
    b = np.concatenate([(w * g).ravel(), np.zeros(2 * N), np.zeros(N)])
    sol = splinalg.spsolve((A.T @ A).tocsc(), A.T @ b).reshape(n, n)
    sol -= np.median(sol)
    sol = ndimage.zoom(sol, coarse, order=1, mode="nearest", grid_mode=True)
    return np.clip(np.exp(-sol), *clip)


def period_field(rng, base, theta, cores, deltas, n, step):
    """Ridge period (finger px) on the grid."""
    x, y = _grid(n, step)
    per = base * flow_period(theta, cores, deltas, step)
    per *= 1.0 + _smooth_noise(rng, n, 60 / step, 0.05)
    # Ridges a little wider towards the fingertip and the lower edge.
    per *= 1.0 + 0.04 * np.clip(np.abs(y) / 200.0, 0, 1)
    # Real ridge periods stay within ~7-13 px at 500 dpi; the growth grid
    # (GRID px per cell) also needs >= ~3.6 cells per period.
    return np.clip(per, max(7.2, 3.6 * GRID), 13.5)


# ---------------------------------------------------------------------------
# Gabor growth (on a half-resolution grid: GRID finger px per cell)

GRID = 2.0


def _gabor_bank_fft(size, periods):
    """rfft2 (size x size, centred at the origin) of even Gabor filters:
    array [period bin, orientation bin].  Returns (bank, kernel half-width)."""
    half = int(math.ceil(1.6 * max(periods)))
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float64)
    bank = np.empty((len(periods), _N_ORI, size, size // 2 + 1), np.complex64)
    for fi, per in enumerate(periods):
        sig_n = 0.45 * per  # across ridges
        sig_u = 0.55 * per  # along ridges
        for k in range(_N_ORI):
            th = k * math.pi / _N_ORI
            du = xx * math.cos(th) + yy * math.sin(th)  # along the ridge
            dn = -xx * math.sin(th) + yy * math.cos(th)  # across the ridge
            env = np.exp(-(du**2) / (2 * sig_u**2) - dn**2 / (2 * sig_n**2))
            g = env * np.cos(2 * math.pi * dn / per)
            g -= env * (g.sum() / env.sum())  # zero DC
            g /= np.abs(g).sum()
            pad = np.zeros((size, size))
            pad[: 2 * half + 1, : 2 * half + 1] = g
            pad = np.roll(pad, (-half, -half), axis=(0, 1))
            bank[fi, k] = sfft.rfft2(pad.astype(np.float32))
    return bank, half


_TILE = 32


def grow_ridges(rng, theta, period, n_seeds=None, iters=16):
    """Iterative space-variant Gabor filtering from random seeds -> field in [-1, 1].

    ``theta`` and ``period`` are sampled on the growth grid (``period`` in
    grid cells); each cell is filtered with the bilinear blend of the two
    nearest orientation bins x two nearest period bins.  Done tile by tile
    (overlap-save FFT convolution) so that a tile only pays for the few
    filters its cells use.
    """
    n = theta.shape[0]
    assert n % _TILE == 0
    pmin, pmax = float(period.min()), float(period.max())
    nb = max(2, int(math.ceil((pmax - pmin) / (0.08 * pmin))) + 1)  # bins <= 8% apart
    periods = np.linspace(pmin, max(pmax, pmin + 0.05), nb)
    half = int(math.ceil(1.6 * periods[-1]))
    size = sfft.next_fast_len(_TILE + 2 * half, real=True)
    bank, half = _gabor_bank_fft(size, periods)
    tb = theta / (math.pi / _N_ORI)
    k0 = np.floor(tb).astype(int) % _N_ORI
    k1 = (k0 + 1) % _N_ORI
    wk = tb - np.floor(tb)
    pb = (period - periods[0]) / (periods[1] - periods[0])
    p0 = np.clip(np.floor(pb).astype(int), 0, nb - 2)
    wp = np.clip(pb - p0, 0, 1)
    tiles = []
    for y0 in range(0, n, _TILE):
        for x0 in range(0, n, _TILE):
            sl = (slice(y0, y0 + _TILE), slice(x0, x0 + _TILE))
            tk0, tk1, twk, tp0, twp = k0[sl], k1[sl], wk[sl], p0[sl], wp[sl]
            terms = []
            for fi in np.unique(np.concatenate([tp0.ravel(), tp0.ravel() + 1])):
                wf = np.where(tp0 == fi, 1 - twp, 0.0) + np.where(tp0 + 1 == fi, twp, 0.0)
                if wf.max() <= 1e-3:
                    continue
                for k in np.unique(np.concatenate([tk0.ravel(), tk1.ravel()])):
                    w = (np.where(tk0 == k, 1 - twk, 0.0) + np.where(tk1 == k, twk, 0.0)) * wf
                    if w.max() > 1e-3:
                        terms.append((fi, k, w))
            filt = np.stack([bank[fi, k] for fi, k, _ in terms])
            wts = np.stack([w for _, _, w in terms]).astype(np.float32)
            tiles.append((y0, x0, filt, wts))

    if n_seeds is None:
        img = rng.standard_normal((n, n)).astype(np.float32) * 0.3
    else:
        img = np.zeros((n, n), np.float32)
        ys = rng.integers(0, n, n_seeds)
        xs = rng.integers(0, n, n_seeds)
        img[ys, xs] = rng.choice([-1.0, 1.0], n_seeds)
        img = ndimage.gaussian_filter(img, 0.7) * 10
    span = size
    for _ in range(iters):
        padded = np.pad(img, ((half, span), (half, span)), mode="wrap")
        out = np.empty_like(img)
        for y0, x0, filt, wts in tiles:
            spec = sfft.rfft2(padded[y0 : y0 + size, x0 : x0 + size])
            resp = sfft.irfft2(spec[None] * filt, s=(size, size), axes=(-2, -1))
            resp = resp[:, half : half + _TILE, half : half + _TILE]
            out[y0 : y0 + _TILE, x0 : x0 + _TILE] = np.einsum("kij,kij->ij", wts, resp)
        # Amplify and saturate: the pattern grows outwards from the seeds.
        img = np.clip(out * 6.0, -1.0, 1.0)
    return img


# ---------------------------------------------------------------------------
# master finger and impressions


class Master:
    """One synthetic finger: a ridge field over the finger, on the growth grid.

    Finger coordinates are 500-dpi pixels centred on the canvas; an
    impression maps output pixels to finger coordinates (scale 1 for the
    "sensor" profile; >1 for "nist", whose frame shows the whole fingertip).
    """

    def __init__(self, seed, index, profile="sensor"):
        prof = PROFILES[profile]
        rng = np.random.default_rng([seed, index, 0])
        r = rng.uniform()
        acc = 0.0
        for cls, p in CLASSES:
            acc += p
            if r < acc:
                break
        self.cls = cls
        self.profile = profile
        self.scale = prof["scale"]
        self.seed, self.index = seed, index
        self.base_period = rng.uniform(*prof["period"])
        # Finger-space extent needed: the output frame at this scale, rotated,
        # shifted and distorted.
        extent = 1.5 * max(OUT_W, OUT_H) * self.scale
        self.n = n = int(math.ceil(extent / GRID / _TILE) * _TILE)
        self.theta, class_theta, self.cores, self.deltas = orientation_field(rng, cls, n, GRID)
        self.period = period_field(rng, self.base_period, class_theta, self.cores, self.deltas, n, GRID)
        n_seeds = int(rng.uniform(*prof["seeds"]) * (n * GRID / 384.0) ** 2)
        self.ridges = grow_ridges(rng, self.theta, self.period / GRID, n_seeds)
        # Finger silhouette in finger coordinates: half-width and top.
        self.half_w = rng.uniform(150, 185) * prof["silhouette"]
        self.top = (rng.uniform(-230, -170) + 40 * rng.uniform(-1, 1)) * prof["silhouette"]
        self.noise_range = prof["noise"]

    def sample(self, fx, fy, order=3):
        """Ridge field at finger coordinates (arrays)."""
        c = (self.n - 1) / 2.0
        return ndimage.map_coordinates(self.ridges, [c + fy / GRID, c + fx / GRID], order=order, mode="constant", cval=0.0)


def placement(rng, h, w, scale=1.0):
    """Finger coordinates (gx, gy) of each output pixel for one touch.

    Rotation (normal, sd 4.5 deg, clipped to +-10 deg), translation (sd 12 px,
    clipped to +-30 px) and a non-linear skin distortion after Cappelli et
    al.: skin near a contact centre stays put, skin further out is dragged
    and twisted, plus a smooth random displacement field.
    """
    rot = float(np.clip(rng.normal(0, 4.5), -10, 10)) * math.pi / 180
    tx, ty = rng.normal(0, 12, 2).clip(-30, 30)
    oy, ox = np.mgrid[0:h, 0:w].astype(np.float64)
    ox = (ox - (w - 1) / 2.0) * scale
    oy = (oy - (h - 1) / 2.0) * scale
    c, s = math.cos(rot), math.sin(rot)
    fx = c * ox - s * oy + tx
    fy = s * ox + c * oy + ty
    pc = rng.normal(0, 25, 2)
    r = np.hypot(fx - pc[0], fy - pc[1])
    ramp = np.clip((r - 40) / 90.0, 0, 1) ** 1.5
    drag = rng.normal(0, 3.0, 2)
    twist = rng.normal(0, 1.2) * math.pi / 180
    m = max(h, w)
    dxf = _smooth_noise(rng, m, 45, 1.6)[:h, :w]
    dyf = _smooth_noise(rng, m, 45, 1.6)[:h, :w]
    gx = fx + ramp * (drag[0] - twist * (fy - pc[1]) + dxf)
    gy = fy + ramp * (drag[1] + twist * (fx - pc[0]) + dyf)
    return gx, gy


def impression(master, k, enrol=False):
    """Impression ``k`` of ``master`` as a uint8 array (OUT_H, OUT_W).

    Enrolment touches (``enrol=True``) use a narrower pressure range, as a
    user does when told to press five times.
    """
    rng = np.random.default_rng([master.seed, master.index, 1 + k])
    gx, gy = placement(rng, OUT_H, OUT_W, master.scale)
    ridge = master.sample(gx, gy)

    # Pressure: ridge thickness and contact area.
    pressure = rng.uniform(-1, 1) * (0.6 if enrol else 1.0)
    thr = -0.25 * pressure
    ink = 1.0 / (1.0 + np.exp(-(ridge - thr) * 5.0))
    # Finger-shaped contact region: superellipse top, open towards the palm.
    hw = master.half_w * (1 + 0.06 * pressure)
    top = master.top * (1 + 0.06 * pressure)
    exn = gx / hw
    eyn = np.minimum(gy, 0) / abs(top)
    rr = (np.abs(exn) ** 2.3 + np.abs(eyn) ** 2.0) ** (1 / 2.15)
    rr = rr + _smooth_noise(rng, OUT_W, 10, 0.03)[:OUT_H]
    contact = np.clip((1.0 - rr) / 0.05, 0, 1)
    # Dry patches: lighter, broken ridges.
    dry = np.clip(_smooth_noise(rng, OUT_W, 14, 1.0)[:OUT_H] - 1.3, 0, None) * rng.uniform(0.5, 1.2)
    ink = ink * (1 - np.clip(dry, 0, 0.8)) * contact

    bg = rng.uniform(200, 235)
    ridge_lvl = rng.uniform(20, 60)
    img = bg - (bg - ridge_lvl) * ink
    img += _smooth_noise(rng, OUT_W, 40, 8.0)[:OUT_H]  # uneven illumination
    img = ndimage.gaussian_filter(img, rng.uniform(0.5, 0.9))
    img += rng.normal(0, rng.uniform(*master.noise_range), img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def warp_real(image, seed, k):
    """Another touch of a real print: the same placement and distortion model
    applied to a scanned image (used for the NIST copies).  Same size out;
    uncovered pixels take the image's light background."""
    rng = np.random.default_rng([seed, 1_000_003, k])
    h, w = image.shape
    gx, gy = placement(rng, h, w)
    img = ndimage.map_coordinates(
        image.astype(np.float64),
        [gy + (h - 1) / 2.0, gx + (w - 1) / 2.0],
        order=1,
        mode="constant",
        cval=float(np.percentile(image, 97)),
    )
    img += rng.normal(0, 4.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)
