"""Drive libfprint's ``virtual_image`` driver from Python (Debian's python3 + gi).

Everything here runs on the calling thread, which must own GLib's default main
context (libfprint's rule).  One :class:`VirtualImage` is one FpContext + one
opened ``virtual_image`` device + one socket connection.

The virtual drivers model overheating: the device fails its action with
FP_DEVICE_ERROR_TOO_HOT ("Device disabled to prevent overheating", code 257
in fprintd's terms) after ~3 minutes of cumulative *active* time (time inside
enroll/verify/identify/capture).  The model belongs to the FpDevice object, so
a fresh FpContext starts cold.  :class:`Readers` hands out a VirtualImage and
replaces it by a fresh one once its active time passes a budget; templates
(FpPrint) stay valid across contexts (same driver and device id).

Images are numpy uint8 arrays (H, W) with W a multiple of 4; on the wire they
are two native-endian int32 (W, H) then W*H bytes.
"""

import os
import re
import socket
import struct
import sys
import tempfile
import time

import gi

gi.require_version("FPrint", "2.0")
from gi.repository import FPrint, GLib  # noqa: E402

DRIVER = "virtual_image"
HOT_BUDGET = 100.0  # seconds of active time per context (libfprint: ~180 s to HOT)


class ReaderError(RuntimeError):
    pass


class TooHot(ReaderError):
    pass


def wire(image):
    """numpy (H, W) uint8 array -> virtual_image wire bytes (header + pixels)."""
    h, w = image.shape
    if w % 4:
        raise ValueError("width %d is not a multiple of 4" % w)
    return struct.pack("ii", w, h) + image.tobytes()


class ScoreTap:
    """Collects the bozorth3 scores libfprint logs ("score N/T", debug domain
    ``libfprint-print``), one per comparison, in the order it made them.

    GLib writes debug messages to fd 1, so fd 1 is pointed at a temporary file
    and Python's ``sys.stdout`` moves to a duplicate of the original fd 1.
    """

    _RE = re.compile(rb"score (-?\d+)/(\d+)")

    def __init__(self):
        self._saved = os.environ.get("G_MESSAGES_DEBUG")
        self.enable()
        sys.stdout.flush()
        real = os.dup(1)
        fd, path = tempfile.mkstemp(prefix="fpgen-scores-")
        os.close(fd)
        # O_APPEND: GLib's writes always land at the end, even after we truncate.
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND)
        os.unlink(path)
        os.dup2(self._fd, 1)
        sys.stdout = os.fdopen(real, "w", buffering=1)
        self._pos = 0
        self.threshold = None

    def enable(self):
        # GLib reads G_MESSAGES_DEBUG at every message, so this takes effect at once.
        domains = self._saved or ""
        if "libfprint-print" not in domains.split() and domains != "all":
            domains = (domains + " libfprint-print").strip()
        os.environ["G_MESSAGES_DEBUG"] = domains

    def disable(self):
        """Stop the per-comparison logging (it costs a little time per score)."""
        if self._saved is None:
            os.environ.pop("G_MESSAGES_DEBUG", None)
        else:
            os.environ["G_MESSAGES_DEBUG"] = self._saved

    def take(self):
        """Scores logged since the last call."""
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size - self._pos, self._pos)
        self._pos = size
        if size > (1 << 20):
            os.ftruncate(self._fd, 0)
            self._pos = 0
        out = []
        for m in self._RE.finditer(data):
            out.append(int(m.group(1)))
            self.threshold = int(m.group(2))
        return out


_TAP = None


def score_tap():
    """The process-wide ScoreTap (created on first use, before any FpContext)."""
    global _TAP
    if _TAP is None:
        _TAP = ScoreTap()
    return _TAP


class Result:
    """Outcome of one verify/identify scan.

    index: matching gallery position (verify: 0) or None; minutiae: libfprint's
    count for the probe; wall: seconds from image sent to the match report;
    cpu: process CPU seconds meanwhile (mindtct on the probe + bozorth3 loop);
    scores: bozorth3 scores in comparison order (None unless tapped).
    """

    __slots__ = ("index", "minutiae", "wall", "cpu", "scores", "done")

    def __init__(self, index, minutiae, wall, cpu, scores):
        self.index, self.minutiae, self.wall, self.cpu, self.scores = index, minutiae, wall, cpu, scores
        self.done = wall

    @property
    def matched(self):
        return self.index is not None

    def __repr__(self):
        return "Result(index=%r, minutiae=%d, wall=%.3f, cpu=%.3f, scores=%r)" % (
            self.index,
            self.minutiae,
            self.wall,
            self.cpu,
            self.scores,
        )


def template_scores(scores, n_templates, per_template=5):
    """Split an identify's score list into the best score per gallery template.

    libfprint compares the probe with each template's prints in order and
    stops at the first score >= threshold, so templates after a match get None.
    """
    out = []
    i = 0
    for _ in range(n_templates):
        chunk = scores[i : i + per_template]
        i += per_template
        out.append(max(chunk) if chunk else None)
    return out


class VirtualImage:
    """A fresh FpContext with the virtual_image device opened and connected.

    With ``scores=True`` every verify/identify also returns the bozorth3
    scores libfprint computed (see :class:`ScoreTap`).
    """

    def __init__(self, scores=False):
        self.tap = score_tap() if scores else None
        if self.tap:
            self.tap.enable()
        elif _TAP is not None:
            _TAP.disable()
        self._tmp = tempfile.TemporaryDirectory(prefix="fpgen-")
        self.sockpath = os.path.join(self._tmp.name, "vimage.sock")
        os.environ["FP_VIRTUAL_IMAGE"] = self.sockpath
        os.environ["FP_DRIVERS_WHITELIST"] = DRIVER
        os.environ["FP_DRIVERS_ALLOWLIST"] = DRIVER
        self.active = 0.0  # seconds spent inside device actions
        self.main = GLib.MainContext.default()
        self.ctx = FPrint.Context()
        self.dev = None
        for dev in self.ctx.get_devices():
            if dev.get_driver() == DRIVER:
                self.dev = dev
                break
        if self.dev is None:
            raise ReaderError("libfprint has no virtual_image device")
        self.dev.open_sync(None)
        self.con = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + 5
        while True:
            try:
                self.con.connect(self.sockpath)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                self._pump(0.01)
        self._pump(0.05)

    # -- plumbing ---------------------------------------------------------
    def _pump(self, seconds=0.0):
        end = time.monotonic() + seconds
        while True:
            while self.main.pending():
                self.main.iteration(False)
            if time.monotonic() >= end:
                return
            time.sleep(0.001)

    def _wait(self, cond, timeout, what):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise ReaderError("timeout waiting for %s" % what)
            self.main.iteration(True)

    def _await_finger(self, finished):
        """Wait until the device wants a finger; False if the action ended first."""
        self._wait(
            lambda: finished() or self.dev.get_finger_status() & FPrint.FingerStatusFlags.NEEDED,
            20.0,
            "the device to await a finger",
        )
        return not finished()

    @staticmethod
    def _raise(what, err):
        if err.matches(FPrint.device_error_quark(), FPrint.DeviceError.TOO_HOT):
            raise TooHot("%s: %s" % (what, err.message))
        raise ReaderError("%s failed: %s" % (what, err.message))

    def send(self, image):
        self.con.sendall(wire(image))

    def close(self):
        try:
            self.con.close()
            if self.dev is not None:
                self.dev.close_sync(None)
        finally:
            self.dev = None
            self.ctx = None
            self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- operations -------------------------------------------------------
    def enroll(self, images, username="fpgen", finger=FPrint.Finger.RIGHT_INDEX):
        """Enrol from a list of images: one per stage, spare ones absorb retries.

        Returns (FpPrint, [minutiae count of each accepted stage], retries).
        """
        st = {"stage": 0, "done": None, "error": None, "mins": [], "retries": 0, "events": 0}

        def progress(dev, stage, prt, *rest):
            err = rest[-1] if rest else None
            st["events"] += 1
            if err is not None:
                st["retries"] += 1
            elif prt is not None:
                img = prt.get_image()
                st["mins"].append(len(img.get_minutiae()) if img else -1)
            st["stage"] = stage

        def done(dev, res):
            try:
                st["done"] = dev.enroll_finish(res)
            except GLib.Error as e:
                st["error"] = e

        def finished():
            return st["done"] is not None or st["error"] is not None

        template = FPrint.Print.new(self.dev)
        template.set_username(username)
        template.set_finger(finger)
        t0 = time.monotonic()
        try:
            self.dev.enroll(template, None, progress, (), done)
            it = iter(images)
            while self._await_finger(finished):
                img = next(it, None)
                if img is None:
                    raise ReaderError(
                        "enrolment needs more images (%d stages done, %d retries)" % (st["stage"], st["retries"])
                    )
                seen = st["events"]
                self.send(img)
                self._wait(lambda: st["events"] > seen or finished(), 60.0, "enrol progress")
        finally:
            self.active += time.monotonic() - t0
        if st["error"] is not None:
            self._raise("enrol", st["error"])
        return st["done"], st["mins"], st["retries"]

    def verify(self, template, image):
        """Verify scan: a :class:`Result` with ``index`` 0 on a match, else None."""
        st = {"res": None, "error": None, "t": None, "c": None}

        def done(dev, res):
            st["t"], st["c"] = time.perf_counter(), time.process_time()
            try:
                st["res"] = dev.verify_finish(res)
            except GLib.Error as e:
                st["error"] = e

        if self.tap:
            self.tap.take()
        a0 = time.monotonic()
        try:
            self.dev.verify(template, None, None, (), done)
            t0, c0 = time.perf_counter(), time.process_time()
            if self._await_finger(lambda: st["t"] is not None):
                t0, c0 = time.perf_counter(), time.process_time()
                self.send(image)
            self._wait(lambda: st["t"] is not None, 1800.0, "verify")
        finally:
            self.active += time.monotonic() - a0
        if st["error"] is not None:
            self._raise("verify", st["error"])
        matched, probe = st["res"]
        scores = self.tap.take() if self.tap else None
        return Result(0 if matched else None, _count(probe), st["t"] - t0, st["c"] - c0, scores)

    def control(self, first, second):
        """A virtual_image control message (-3: automatic finger on/off, -4: finger on/off)."""
        self.con.sendall(struct.pack("ii", first, second))

    def identify(self, gallery, image, hold=0.0):
        """One identify scan of ``image`` over ``gallery`` (list of FpPrint).  With ``hold``
        (seconds) the finger stays on the sensor that long after the image; the Result's times
        are to libfprint's match report, ``done`` to the end of the operation (image sensors end
        it only once the finger is lifted)."""
        st = {"res": None, "error": None, "t_match": None, "t_done": None}

        def matched(dev, match, prt, *rest):
            if st["t_match"] is None:
                st["t_match"], st["c_match"] = time.perf_counter(), time.process_time()

        def done(dev, res):
            st["t_done"], st["c_done"] = time.perf_counter(), time.process_time()
            try:
                st["res"] = dev.identify_finish(res)
            except GLib.Error as e:
                st["error"] = e

        if self.tap:
            self.tap.take()
        a0 = time.monotonic()
        try:
            self.dev.identify(gallery, None, matched, (), done)
            t0, c0 = time.perf_counter(), time.process_time()
            if self._await_finger(lambda: st["t_done"] is not None):
                if hold:
                    self.control(-3, 0)
                    self.control(-4, 1)
                t0, c0 = time.perf_counter(), time.process_time()
                self.send(image)
                if hold:
                    while time.perf_counter() - t0 < hold and st["t_done"] is None:
                        self._pump(0.002)
                    self.control(-4, 0)
                    self.control(-3, 1)
            self._wait(lambda: st["t_done"] is not None, 3600.0, "identify")
        finally:
            self.active += time.monotonic() - a0
        if st["error"] is not None:
            self._raise("identify", st["error"])
        match, probe = st["res"]
        idx = None
        if match is not None:
            for i, p in enumerate(gallery):
                if p is match or p.equal(match):
                    idx = i
                    break
        key = "match" if st["t_match"] is not None else "done"
        scores = self.tap.take() if self.tap else None
        result = Result(idx, _count(probe), st["t_" + key] - t0, st["c_" + key] - c0, scores)
        result.done = st["t_done"] - t0
        return result

    def minutiae(self, image):
        """Minutiae libfprint's mindtct finds in ``image`` (capture action): [(x, y)]."""
        st = {"img": None, "error": None}

        def done(dev, res):
            try:
                st["img"] = dev.capture_finish(res)
            except GLib.Error as e:
                st["error"] = e

        a0 = time.monotonic()
        try:
            self.dev.capture(True, None, done)
            if self._await_finger(lambda: st["img"] is not None or st["error"] is not None):
                self.send(image)
            self._wait(lambda: st["img"] is not None or st["error"] is not None, 60.0, "capture")
        finally:
            self.active += time.monotonic() - a0
        if st["error"] is not None:
            self._raise("capture", st["error"])
        return [tuple(m.get_coords()) for m in st["img"].get_minutiae()]


class Readers:
    """Hands out a VirtualImage, replacing it by a fresh context (cold device)
    before its active time reaches ``budget`` seconds, or after TooHot."""

    def __init__(self, scores=False, budget=HOT_BUDGET):
        self.scores, self.budget = scores, budget
        self._cur = None
        self.contexts = 0

    def get(self, expect=0.0):
        """A reader with at least ``expect`` seconds of budget left (best effort)."""
        if self._cur is not None and self._cur.active + expect > self.budget:
            self.recycle()
        if self._cur is None:
            self._cur = VirtualImage(scores=self.scores)
            self.contexts += 1
        return self._cur

    def recycle(self):
        if self._cur is not None:
            self._cur.close()
            self._cur = None

    def call(self, op, *args, expect=0.0):
        """``getattr(reader, op)(*args)``, retried once on a fresh context if TooHot."""
        try:
            return getattr(self.get(expect), op)(*args)
        except TooHot:
            self.recycle()
            return getattr(self.get(), op)(*args)

    def close(self):
        self.recycle()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _count(prt):
    if prt is None:
        return -1
    img = prt.get_image()
    return len(img.get_minutiae()) if img is not None else -1


def serialize(prt):
    return bytes(prt.serialize())


def deserialize(data):
    return FPrint.Print.deserialize(data)
