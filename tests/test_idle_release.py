"""[Daemon] IdleReleaseSec (issue #15's footprint): once start-up's work is done, and whenever the
socket has had no call for IdleReleaseSec, the daemon unmaps the pages of code and constants of
its program and libraries (they stay in the page cache) and returns its allocator's free memory.

Asserted both ways: that the memory is handed back (against the same daemon with the release
off), that a release waits for a quiet socket and does not repeat without calls, and that
nothing is lost: fingerprint, passcode and account calls from concurrent callers, with releases
running between and during them, all answer as they should.
"""

import random
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from fprint_virtual import environment, scan
from idp_testing import wait_until
from elf_residency import binary_sections
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHD, connect, read_message, send_message
from socket_fuzz import rss_kib
from test_fingerprint_e2e import enroll, verify_on

RELEASED = re.compile(r"idle memory released .*file_kib=(-?\d+)->(-?\d+) .*reason=([a-z-]+)")


REPO = Path(__file__).resolve().parent.parent


def start(make_daemon, release: str, test_seconds: str | None = None):
    d = make_daemon(config=FAST_HASH_CONFIG + f"\n[Daemon]\nLogLevel=debug\nIdleReleaseSec={release}\n")
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device_storage", sensor, base={}))
    if test_seconds:  # debug builds only: shorter than the configuration allows
        d.extra_env["KIOSKAUTH_TEST_IDLE_RELEASE_SECONDS"] = test_seconds
    d.start()
    return d, sensor


def releases(d, reason: str | None = None) -> list[tuple[int, int]]:
    """The releases logged so far (file-backed resident KiB before and after), of `reason`."""
    return [(int(m[1]), int(m[2])) for m in RELEASED.finditer(d.log_text()) if reason in (None, m[3])]


def text_resident(pid: int) -> int:
    sections = binary_sections(pid, str(KIOSKAUTHD))
    assert sections is not None, "/proc/PID/pagemap cannot be read"
    return sections.get(".text", (0, 0))[0]


def verify_passcode(d, name: str, passcode: str) -> dict:
    return d.call("io.kioskauth.VerifyPasscode", {"name": name, "passcode": passcode})


def verify_finger(d, sensor, name: str, finger_id: str, wait: float = 0) -> dict:
    s = connect(d.socket, timeout=30)
    try:
        return verify_on(s, sensor, finger_id, name, wait=wait)
    finally:
        s.close()


def test_start_up_hands_back_the_code_it_ran(make_daemon):
    kept, _ = start(make_daemon, "0")
    released, _ = start(make_daemon, "30")
    wait_until(lambda: releases(released, "start-up"), 30, message="the start-up release")
    wait_until(lambda: "store rows checked" in kept.log_text(), 30, message="the store sweep")
    time.sleep(1)  # both settle: what idling touches comes back
    assert releases(kept) == [], "IdleReleaseSec=0 released"
    k, r = rss_kib(kept.proc.pid, "RssFile"), rss_kib(released.proc.pid, "RssFile")
    assert r < 0.6 * k, (k, r)
    assert text_resident(released.proc.pid) < 0.6 * text_resident(kept.proc.pid)
    for d in (kept, released):
        assert "error" not in d.call("io.kioskauth.GetStatus")
    before, after = releases(released, "start-up")[0]
    assert after < before / 2, (before, after)


def test_a_release_waits_for_a_quiet_socket_and_calls_after_it_are_served(make_daemon):
    d, sensor = start(make_daemon, "1")
    wait_until(lambda: releases(d, "start-up"), 30, message="the start-up release")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply
    r = d.call("io.kioskauth.SetPasscode", {"name": "sarah", "passcode": "482913", "confirmation": "482913"})
    assert "error" not in r, r
    # The release after those calls (one may also have come during the enrolment): once the count
    # has stayed put for longer than the quiet, nothing is due.
    wait_until(lambda: releases(d, "idle"), 10, message="an idle release")
    idle_before = len(releases(d, "idle"))
    settled = time.monotonic()
    while time.monotonic() - settled < 1.5:
        time.sleep(0.1)
        if len(releases(d, "idle")) != idle_before:
            idle_before, settled = len(releases(d, "idle")), time.monotonic()
    # A call every 0.3 s for 4 s, on one connection: never a second of quiet, so no release.
    status = connect(d.socket, timeout=10)
    try:
        for _ in range(13):
            send_message(status, {"method": "io.kioskauth.GetStatus", "parameters": {}})
            assert "error" not in read_message(status)
            time.sleep(0.3)
    finally:
        status.close()
    assert len(releases(d, "idle")) == idle_before, d.log_text()[-2000:]
    # Quiet now: one release, and no more while nothing calls.
    wait_until(lambda: len(releases(d, "idle")) == idle_before + 1, 10, message="an idle release")
    time.sleep(2.5)
    assert len(releases(d, "idle")) == idle_before + 1
    before, after = releases(d, "idle")[-1]
    assert after < 0.6 * before, (before, after)
    # What ran before the release runs again after it.
    matched = verify_finger(d, sensor, "sarah", "sarah-finger")
    assert "error" not in matched and matched["parameters"].get("ticket"), matched
    stranger = verify_finger(d, sensor, "sarah", "stranger-finger")
    assert stranger.get("error") == "io.kioskauth.FingerprintNotRecognized", stranger
    assert verify_passcode(d, "sarah", "482913").get("error") is None
    assert verify_passcode(d, "sarah", "000000").get("error") == "io.kioskauth.WrongPasscode"
    # A scan that waits for its touch longer than the quiet: released meanwhile, then matched.
    s = connect(d.socket, timeout=30)
    try:
        send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": "sarah"}, "more": True})
        assert read_message(s)["parameters"]["progress"]["state"] == "touch"
        count = len(releases(d, "idle"))
        wait_until(lambda: len(releases(d, "idle")) > count, 10, message="a release while the scan waits")
        scan(sensor, "sarah-finger")
        during = read_message(s)
    finally:
        s.close()
    assert "error" not in during and during["parameters"].get("ticket"), during


def test_background_work_that_maps_code_in_is_released_without_a_call(make_daemon, tmp_path):
    """Work no call wakes (here the metrics file, written every 2 s) maps code in again; once it
    has grown by a megabyte and no call came within the quiet, the daemon releases it."""
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Daemon]\nLogLevel=debug\nIdleReleaseSec=1\n"
                    f"[Metrics]\nTextfilePath={tmp_path / 'kioskauth.prom'}\nTextfileIntervalSec=2\n")
    d.start()
    wait_until(lambda: releases(d, "start-up"), 30, message="the start-up release")
    # A megabyte or more released (each write of the file maps some of it in again; a release
    # waits for the figure to hold still first, so one that ran under a write, freeing nothing,
    # is rare, but the next one frees what that write mapped).
    wait_until(lambda: [r for r in releases(d, "background") if r[0] - r[1] >= 1024], 20,
               message="a release of a megabyte or more after the metrics file was written")
    assert releases(d, "idle") == [], "no call was made"


def test_shutdown_is_prompt_while_a_release_waits(make_daemon):
    # Waiting for a call, and waiting out the quiet after one: SIGTERM ends the daemon cleanly.
    d, _ = start(make_daemon, "30")
    wait_until(lambda: releases(d, "start-up"), 30, message="the start-up release")
    started = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - started < 5
    d.start()
    assert "error" not in d.call("io.kioskauth.GetStatus")
    started = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - started < 5


def test_a_wait_shorter_than_a_second_is_a_named_configuration_error(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Daemon]\nIdleReleaseSec=0.5\n")
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "IdleReleaseSec=0.5: expected 0 (never), or 1 or more seconds" in d.log_text(), d.log_text()


def test_a_release_keeps_private_copies_and_an_object_being_opened(tmp_path):
    """The release itself, in a program of its own (tests/release_probe): a page of constants it
    made writable, wrote and made read-only again (as a debugger's breakpoint, a uprobe or a live
    patch writes code) stays mapped with what was written, while the constant pages beside it are
    unmapped; and a library opened, used and closed over and
    over on another thread while releases run back to back is always read right."""
    compiler = shutil.which("cc") or shutil.which("clang")
    assert compiler, "no C compiler"
    probe, library = tmp_path / "probe", tmp_path / "libprobe.so"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(library),
                    str(REPO / "tests" / "release_probe" / "library.c")], check=True)
    subprocess.run([compiler, "-O1", "-I", str(REPO / "Sources" / "CKioskAuthSystem" / "include"), "-o", str(probe),
                    str(REPO / "tests" / "release_probe" / "probe.c"),
                    str(REPO / "Sources" / "CKioskAuthSystem" / "system.c"), "-lpthread", "-ldl"], check=True)
    run = subprocess.run([str(probe), str(library), "3"], capture_output=True, text=True, timeout=60)
    assert "after a release: file pages unmapped, the written page kept" in run.stdout, run.stdout + run.stderr
    assert "written constant after a release: 42" in run.stdout, run.stdout + run.stderr
    assert "neighbouring constants: 1 3" in run.stdout, run.stdout
    assert re.search(r"mismatches 0;", run.stdout), run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr


def test_concurrent_callers_lose_nothing_while_releases_run_between_and_during_their_calls(make_daemon):
    """Releases after 50 ms of quiet (a debug build's test override), so many land while a call is in progress (a hash on its
    thread, a scan waiting for its touch, an account looked up through NSS) and between calls."""
    d, sensor = start(make_daemon, "1", test_seconds="0.05")
    wait_until(lambda: releases(d, "start-up"), 30, message="the start-up release")
    for name in ("sarah", "omar"):
        assert d.ctl("user", "add", name).returncode == 0
        r = d.call("io.kioskauth.SetPasscode", {"name": name, "passcode": "482913", "confirmation": "482913"})
        assert "error" not in r, r
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    failures: list[str] = []
    counts: dict[str, int] = {}
    counted = threading.Lock()
    stop = time.monotonic() + 10

    def caller(kind: str, seed: int):
        rng = random.Random(seed)
        n = 0
        try:
            while time.monotonic() < stop:
                if kind == "passcode":
                    r = verify_passcode(d, "omar", "482913")
                    if "error" in r:
                        failures.append(f"passcode: {r}")
                elif kind == "status":
                    r = d.call("io.kioskauth.GetStatus")
                    if "error" in r or "people" not in r.get("parameters", {}):
                        failures.append(f"status: {r}")
                elif kind == "finger":
                    r = verify_finger(d, sensor, "sarah", "sarah-finger", wait=rng.uniform(0, 0.2))
                    if "error" in r or not r["parameters"].get("ticket"):
                        failures.append(f"finger: {r}")
                elif kind == "accounts":
                    name = f"temp{seed}x{n}"
                    added = d.ctl("user", "add", name)
                    removed = d.ctl("user", "remove", name)
                    if added.returncode != 0 or removed.returncode != 0:
                        failures.append(f"accounts: {added.stderr} {removed.stderr}")
                n += 1
                time.sleep(rng.uniform(0, 0.6))
        except Exception as e:  # noqa: BLE001 — reported below with the daemon's state
            failures.append(f"{kind}: {e!r}")
        with counted:
            counts[kind] = counts.get(kind, 0) + n

    threads = [threading.Thread(target=caller, args=(kind, i)) for i, kind in
               enumerate(["passcode", "passcode", "status", "status", "finger", "accounts"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.proc.poll() is None, d.log_text()[-3000:]
    assert failures == [], failures[:5]
    assert all(counts.get(k, 0) >= 3 for k in ("passcode", "status", "finger", "accounts")), counts
    assert len(releases(d, "idle")) >= 10, len(releases(d, "idle"))
    assert "idle memory release incomplete" not in d.log_text()
