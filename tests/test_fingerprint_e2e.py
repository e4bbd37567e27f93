"""Fingerprints through the real daemon and libfprint's own virtual readers.

Each test starts its own daemon (a fresh libfprint context), so the virtual drivers'
overheating model never trips.
"""

import json
import select
import socket
import subprocess
import threading
import time

import pytest

from fprint_virtual import PrintImage, VirtualDevice, VirtualImage, environment, no_reader_environment, prints_directory, scan
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHCTL, connect, read_message, send_message


def start(make_daemon, kind, config=""):
    d = make_daemon(config=FAST_HASH_CONFIG + config)
    sensor = d.root / "sensor.sock"
    d.extra_env.update({k: v for k, v in environment(kind, sensor, base={}).items()})
    d.start()
    return d, sensor


def stored_ids(sensor):
    return VirtualDevice(sensor).stored_ids()


def have_nist_prints():
    try:
        prints_directory()
        return True
    except FileNotFoundError:
        return False


CHECK_HINT = "touch the reader to check this finger is not already enrolled"


def wants_touch(progress):
    """Whether the reader waits for a finger after this progress report."""
    if progress["state"] == "duplicate-check":
        return progress.get("hint") == CHECK_HINT
    return progress.get("stage", 0) < progress.get("stages", 1)


def enroll(d, sensor, name, finger_id, finger="right-index"):
    """Enrols over the socket, touching the virtual reader whenever it asks; returns the final reply
    and the progress reports."""
    s = connect(d.socket, timeout=30)
    send_message(s, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name, "finger": finger}, "more": True})
    reports = []
    while True:
        reply = read_message(s)
        progress = (reply.get("parameters") or {}).get("progress")
        if "error" in reply or progress is None:
            return reply, reports
        reports.append(progress)
        if wants_touch(progress):
            scan(sensor, finger_id)


def test_reader_is_listed(make_daemon):
    d, _ = start(make_daemon, "virtual_device_storage")
    readers = json.loads(d.ctl("reader", "--json").stdout)["readers"]
    assert [(r["driver"], r["canIdentify"], r["hasStorage"]) for r in readers] == [("virtual_device_storage", True, True)]


def test_no_reader_means_passcode_only_and_a_plain_named_error(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG)
    d.extra_env.update(no_reader_environment(base={}))
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    assert json.loads(d.ctl("reader", "--json").stdout)["readers"] == []
    r = d.call("io.kioskauth.Identify", {})
    assert r["error"] in ("io.kioskauth.NoReader", "io.kioskauth.NotIdentified")
    r = d.call("io.kioskauth.EnrollFinger", {"name": "sarah"})
    assert r["error"] == "io.kioskauth.NoReader"
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    assert d.ctl("passcode", "verify", "sarah", input="482913\n").returncode == 0


def test_enrol_with_progress_then_identify_and_remove_deletes_the_sensor_print(make_daemon):
    d, sensor = start(make_daemon, "virtual_device_storage")
    for name in ("sarah", "omar"):
        assert d.ctl("user", "add", name, "--display-name", name.title()).returncode == 0

    # kioskauthctl shows live progress; each line it prints is a prompt for the next touch.
    proc = subprocess.Popen([str(KIOSKAUTHCTL), "finger", "enroll", "sarah", "--socket", d.socket],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line.strip())
        if "stage 5/5" not in line:
            scan(sensor, "sarah-finger")
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 0, lines
    assert "enrolled right-index for sarah" in out
    # The first finger on the terminal duplicates nobody's: no note that duplicates went unchecked.
    assert "duplicates" not in out and not any("duplicate" in line for line in lines), (out, lines)
    assert lines[0] == "[--------------------] stage 0/5: Touch the fingerprint reader"
    assert lines[-1].startswith("[####################] stage 5/5")

    # omar: the duplicate check touch comes first (the reader can identify), then 5 stages.
    reply, reports = enroll(d, sensor, "omar", "omar-finger")
    assert reply["parameters"]["duplicateChecked"] is True
    assert reports[0] == {"state": "duplicate-check", "stage": 0, "stages": 5, "hint": CHECK_HINT}
    assert [r.get("stage") for r in reports if r["state"] == "stage"] == [1, 2, 3, 4, 5]

    # Walk-up identify picks the right person.
    ident = subprocess.Popen([str(KIOSKAUTHCTL), "identify", "--socket", d.socket], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert ident.stderr.readline().strip() == "Touch the fingerprint reader"
    scan(sensor, "omar-finger")
    out, err = ident.communicate(timeout=30)
    assert ident.returncode == 0, err
    assert out.strip() == "Welcome back, Omar (omar)"

    assert stored_ids(sensor) == {"sarah-finger", "omar-finger"}
    assert d.ctl("user", "remove", "sarah").returncode == 0
    assert stored_ids(sensor) == {"omar-finger"}


def ctl_enroll(d, sensor, name, finger_id, *args):
    """kioskauthctl finger enroll, touching the virtual reader whenever it prompts."""
    proc = subprocess.Popen([str(KIOSKAUTHCTL), "finger", "enroll", name, *args, "--socket", d.socket],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line.strip())
        if line.startswith(("[", "touch the reader")) and "stage 5/5" not in line:
            scan(sensor, finger_id)
    out = proc.stdout.read()
    return proc.wait(timeout=30), out, lines


def test_a_finger_enrolled_to_someone_else_is_refused(make_daemon):
    d, sensor = start(make_daemon, "virtual_device_storage")
    for name in ("sarah", "mallory"):
        assert d.ctl("user", "add", name).returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply
    # The error names the finger the touch matched (and, to an admin, whose), not the one asked for.
    reply, reports = enroll(d, sensor, "mallory", "sarah-finger", finger="left-thumb")
    assert reply["error"] == "io.kioskauth.FingerAlreadyEnrolled", reply
    assert reply["parameters"] == {"finger": "right-index", "name": "sarah"}, reply
    assert json.loads(d.ctl("user", "show", "mallory", "--json").stdout)["person"]["fingers"] == []
    code, out, lines = ctl_enroll(d, sensor, "mallory", "sarah-finger", "--finger", "left-thumb")
    assert code == 1, (out, lines)
    assert lines[-1] == "kioskauthctl: that finger is already enrolled as sarah's right-index", lines


def test_fingers_the_sensor_lost_in_a_restart_are_shown_missing(make_daemon):
    """libfprint's virtual storage reader forgets its prints when the daemon restarts: the store
    still has them, and finger list, user show and user list say which ones the sensor lacks."""
    d, sensor = start(make_daemon, "virtual_device_storage")
    assert d.ctl("user", "add", "sarah").returncode == 0
    for finger, finger_id in (("right-index", "sarah-1"), ("left-index", "sarah-2")):
        reply, _ = enroll(d, sensor, "sarah", finger_id, finger=finger)
        assert reply["parameters"]["finger"] == finger, reply
    assert d.ctl("finger", "list", "sarah").stdout.splitlines() == ["right-index", "left-index"]
    assert "fingersMissingFromSensor" not in json.loads(d.ctl("user", "show", "sarah", "--json").stdout)["person"]

    d.restart()
    deadline = time.monotonic() + 15
    while True:
        listed = json.loads(d.ctl("finger", "list", "sarah", "--json").stdout)
        if listed.get("missingFromSensor") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert listed == {"fingers": ["right-index", "left-index"], "missingFromSensor": ["right-index", "left-index"]}
    lines = d.ctl("finger", "list", "sarah").stdout.splitlines()
    assert lines[:2] == ["right-index\tmissing from the sensor", "left-index\tmissing from the sensor"]
    assert "finger remove sarah --finger FINGER" in lines[2]
    person = json.loads(d.ctl("user", "show", "sarah", "--json").stdout)["person"]
    assert person["fingersMissingFromSensor"] == ["right-index", "left-index"]
    show = d.ctl("user", "show", "sarah").stdout
    assert "missing:       right-index, left-index (not on the sensor: cannot match)" in show
    assert "right-index(missing),left-index(missing)" in d.ctl("user", "list").stdout
    assert "2 enrolled fingers are missing from the sensor" in d.log_text()

    # Enrolled again, a finger is on the sensor and no longer reported.
    assert d.ctl("finger", "remove", "sarah", "--finger", "right-index").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-1", finger="right-index")
    assert reply["parameters"]["person"]["fingersMissingFromSensor"] == ["left-index"], reply
    assert json.loads(d.ctl("finger", "list", "sarah", "--json").stdout) == {
        "fingers": ["left-index", "right-index"], "missingFromSensor": ["left-index"]}


def test_completion_offers_a_persons_enrolled_fingers(make_daemon):
    d, sensor = start(make_daemon, "virtual_device_storage")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-1", finger="left-ring")
    assert reply["parameters"]["finger"] == "left-ring", reply
    words = ["kioskauthctl", "finger", "remove", "sarah", "--finger", ""]
    r = subprocess.run([str(KIOSKAUTHCTL), "---completion", "finger", "remove", "--", "--finger", "5", "0", *words],
                       capture_output=True, text=True, timeout=30, env={"KIOSKAUTH_SOCKET": d.socket})
    assert (r.returncode, r.stdout.split()) == (0, ["left-ring"]), r


def verify_on(s, sensor, finger, name="sarah", wait: float = 0):
    """One VerifyFinger on the open connection `s`, touching `finger` when asked (`wait` seconds
    after)."""
    send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": name}, "more": True})
    first = read_message(s)
    if "error" in first:
        return first
    assert first["parameters"]["progress"] == {"state": "touch", "hint": "Touch the fingerprint reader"}
    assert first["continues"] is True
    time.sleep(wait)
    scan(sensor, finger)
    return read_message(s)


def test_three_failed_matches_switch_to_the_passcode(make_daemon):
    """Three failed matches in one authentication attempt (one connection) require the fallback
    there; the count belongs to that attempt, not to the person."""
    d, sensor = start(make_daemon, "virtual_device_storage")
    assert d.ctl("user", "add", "sarah").returncode == 0
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    attempt = connect(d.socket, timeout=30)
    for n in (1, 2):
        r = verify_on(attempt, sensor, "someone-else")
        assert r["error"] == "io.kioskauth.FingerprintNotRecognized"
        assert r["parameters"] == {"failures": n, "fallbackRequired": False, "fallback": "passcode"}
    r = verify_on(attempt, sensor, "someone-else")
    assert r["parameters"] == {"failures": 3, "fallbackRequired": True, "fallback": "passcode"}
    # On this connection the finger is no longer asked for: the passcode is.
    r = verify_on(attempt, sensor, "sarah-finger")
    assert r["error"] == "io.kioskauth.FallbackRequired" and r["parameters"]["fallback"] == "passcode"
    # The count is sarah's on this connection: a kiosk app's connection still verifies omar.
    assert d.ctl("user", "add", "omar").returncode == 0
    reply, _ = enroll(d, sensor, "omar", "omar-finger")
    assert reply["parameters"]["finger"] == "right-index", reply
    r = verify_on(attempt, sensor, "omar-finger", name="omar")
    assert r["parameters"]["person"]["name"] == "omar", r
    attempt.close()
    # Nothing durable is left for the person: a new attempt matches her finger.
    fresh = connect(d.socket, timeout=30)
    r = verify_on(fresh, sensor, "sarah-finger")
    assert r["parameters"]["person"]["name"] == "sarah", r
    assert r["parameters"]["person"]["fingerprintFailures"] == 0
    fresh.close()


def test_a_colleague_cannot_lock_someone_out_of_every_path(make_daemon):
    """Issue #11 item 6, the exact sequence: three of a stranger's touches as alice, then ten
    wrong passcodes. Her passcode is hard-locked, her own finger still unlocks her; a stranger who
    opens new connections does not get unlimited tries: the terminal pauses fingerprint matching."""
    d, sensor = start(make_daemon, "virtual_device_storage",
                      config="\n[Passcode]\nLockoutDelaysSec=0\n[Fingerprint]\nIdentifyPauseAfter=5\nIdentifyPauseSec=4\n")
    assert d.ctl("user", "add", "alice").returncode == 0
    assert d.ctl("passcode", "set", "alice", input="482913\n482913\n").returncode == 0
    reply, _ = enroll(d, sensor, "alice", "alice-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    # Three stranger touches as alice, each on a new connection (as the PAM module makes them).
    for n in (1, 2, 3):
        s = connect(d.socket, timeout=30)
        r = verify_on(s, sensor, "stranger", name="alice")
        s.close()
        assert r["error"] == "io.kioskauth.FingerprintNotRecognized", r
        assert r["parameters"]["failures"] == 1 and r["parameters"]["fallbackRequired"] is False
    # Ten wrong passcodes hard-lock her passcode.
    for _ in range(10):
        wrong = d.call("io.kioskauth.VerifyPasscode", {"name": "alice", "passcode": "111111"})
        assert wrong["error"] in ("io.kioskauth.WrongPasscode", "io.kioskauth.PasscodeLocked")
    locked = d.call("io.kioskauth.VerifyPasscode", {"name": "alice", "passcode": "482913"})
    assert locked["error"] == "io.kioskauth.PasscodeLocked" and locked["parameters"]["hardLocked"] is True
    # Her own finger unlocks her all the same.
    s = connect(d.socket, timeout=30)
    r = verify_on(s, sensor, "alice-finger", name="alice")
    s.close()
    assert "error" not in r and r["parameters"]["person"]["name"] == "alice", r
    assert r["parameters"]["ticket"]

    # A stranger opening a new connection for every touch: the 5th unknown finger in a row on the
    # terminal pauses fingerprint matching, whichever connection asks.
    results = []
    for _ in range(6):
        s = connect(d.socket, timeout=30)
        results.append(verify_on(s, sensor, "stranger", name="alice")["error"].rsplit(".", 1)[-1])
        s.close()
    assert results == ["FingerprintNotRecognized"] * 5 + ["FingerprintPaused"], results
    paused = d.call("io.kioskauth.VerifyFinger", {"name": "alice"})
    assert paused["error"] == "io.kioskauth.FingerprintPaused" and 1 <= paused["parameters"]["retryAfterSeconds"] <= 4
    # After the pause her own finger works again.
    time.sleep(4.5)
    s = connect(d.socket, timeout=30)
    r = verify_on(s, sensor, "alice-finger", name="alice")
    s.close()
    assert r["parameters"]["person"]["name"] == "alice", r


def test_client_disconnect_cancels_the_scan(make_daemon):
    d, sensor = start(make_daemon, "virtual_device")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    s = connect(d.socket)
    send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": "sarah"}, "more": True})
    assert read_message(s)["parameters"]["progress"]["state"] == "touch"
    s.close()
    time.sleep(0.5)
    # The reader is free at once: the next verify is served, not queued behind a 30 s scan.
    started = time.monotonic()
    s = connect(d.socket)
    send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": "sarah"}, "more": True})
    assert read_message(s)["parameters"]["progress"]["state"] == "touch"
    scan(sensor, "sarah-finger")
    assert read_message(s)["parameters"]["person"]["name"] == "sarah"
    assert time.monotonic() - started < 10
    events = json.loads(d.ctl("audit", "--json").stdout)["events"]
    assert any(e["action"] == "finger.verify" and e.get("detail") == "io.kioskauth.ScanCancelled" for e in events)


def test_scan_timeout_is_a_named_error(make_daemon):
    d, sensor = start(make_daemon, "virtual_device", config="\n[Fingerprint]\nScanTimeoutSec=1\n")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply
    started = time.monotonic()
    r = d.call("io.kioskauth.VerifyFinger", {"name": "sarah"})
    assert r["error"] == "io.kioskauth.ScanTimeout" and r["parameters"]["seconds"] == 1
    assert time.monotonic() - started < 5


def test_identify_needs_an_authenticator_and_no_remote_session(make_daemon):
    d, sensor = start(make_daemon, "virtual_device_storage")
    assert d.call("io.kioskauth.Identify", {}, user="nobody")["error"] == "io.kioskauth.PermissionDenied"
    r = d.call("io.kioskauth.Identify", {"context": {"service": "sshd", "remote": True}})
    assert r["error"] == "io.kioskauth.FingerprintNotAllowed"


def test_unknown_fingers_pause_identify(make_daemon):
    d, sensor = start(make_daemon, "virtual_device_storage", config="\n[Fingerprint]\nIdentifyPauseAfter=2\nIdentifyPauseSec=60\n")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    def identify_with(finger):
        s = connect(d.socket, timeout=30)
        send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        assert read_message(s)["parameters"]["progress"]["state"] == "touch"
        scan(sensor, finger)
        return read_message(s)

    assert identify_with("stranger")["parameters"] == {"unknownInARow": 1, "askForName": False}
    assert identify_with("stranger")["parameters"]["unknownInARow"] == 2
    paused = d.call("io.kioskauth.Identify", {})
    assert paused["error"] == "io.kioskauth.IdentifyPaused" and 55 <= paused["parameters"]["retryAfterSeconds"] <= 60


def test_ten_concurrent_unknown_fingers_scan_exactly_the_pause_count(make_daemon):
    """Issue #11 item 7: ten concurrent walk-up identifies on separate connections, every touch a
    stranger's. Exactly IdentifyPauseAfter (5) are scanned, each with its own place in the run;
    the other five are refused with IdentifyPaused and never scanned."""
    d, sensor = start(make_daemon, "virtual_device_storage", config="\n[Fingerprint]\nIdentifyPauseAfter=5\nIdentifyPauseSec=60\n")
    assert d.ctl("user", "add", "sarah").returncode == 0
    reply, _ = enroll(d, sensor, "sarah", "sarah-finger")
    assert reply["parameters"]["finger"] == "right-index", reply

    finals = []
    lock = threading.Lock()
    barrier = threading.Barrier(10)

    def identify():
        s = connect(d.socket, timeout=60)
        barrier.wait()
        send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        while True:
            r = read_message(s)
            if not r.get("continues"):
                break
        with lock:
            finals.append(r)
        s.close()

    threads = [threading.Thread(target=identify) for _ in range(10)]
    for t in threads:
        t.start()
    # One stranger's touch at a time, each once the previous one was answered.
    for n in range(1, 6):
        time.sleep(0.5)
        scan(sensor, "stranger")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if sum(1 for r in finals if r.get("error") == "io.kioskauth.NotIdentified") >= n:
                    break
            time.sleep(0.05)
    for t in threads:
        t.join(60)
    errors = sorted(r["error"].rsplit(".", 1)[-1] for r in finals)
    assert errors == ["IdentifyPaused"] * 5 + ["NotIdentified"] * 5, finals
    runs = sorted(r["parameters"]["unknownInARow"] for r in finals if r["error"].endswith("NotIdentified"))
    assert runs == [1, 2, 3, 4, 5]
    scanned = [e for e in json.loads(d.ctl("audit", "--json").stdout)["events"]
               if e["action"] == "finger.identify" and e["result"] == "failure"]
    assert len(scanned) == 5


@pytest.mark.skipif(not have_nist_prints(), reason="NIST prints not found (set KIOSKAUTH_TESTDATA)")
def test_image_reader_matches_a_second_impression_and_not_another_finger(make_daemon):
    d, sensor = start(make_daemon, "virtual_image")
    for name, finger in {"sarah": "arch", "omar": "loop-right", "lena": "whorl"}.items():
        enroll_image(d, sensor, name, finger)

    def identify_with(print_name):
        s = connect(d.socket, timeout=60)
        send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        assert read_message(s)["parameters"]["progress"]["state"] == "touch"
        conn = VirtualImage(sensor)
        conn.send_print(print_name)
        reply = read_message(s)
        conn.close()
        return reply

    assert identify_with("loop-right-rot")["parameters"]["person"]["name"] == "omar"
    assert identify_with("arch-rot")["parameters"]["person"]["name"] == "sarah"
    assert identify_with("tented_arch")["error"] == "io.kioskauth.NotIdentified"


def enroll_image(d, sensor, name, print_name):
    """Enrols `name` on the image reader with the NIST print `print_name` for every touch."""
    assert d.ctl("user", "add", name).returncode == 0
    image = PrintImage.load(print_name)
    conn = VirtualImage(sensor)
    sock = connect(d.socket, timeout=60)
    send_message(sock, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name}, "more": True})
    while True:
        reply = read_message(sock)
        progress = (reply.get("parameters") or {}).get("progress")
        if "error" in reply or progress is None:
            break
        if wants_touch(progress):
            conn.send_image(image)
    conn.close()
    assert reply["parameters"]["finger"] == "right-index", reply


def identify_image(d, sensor, print_name, hold=0.0):
    """One walk-up identify touched with `print_name`; with `hold`, the finger stays down that long
    after the image. Returns the final reply and the seconds from the image to it."""
    s = connect(d.socket, timeout=60)
    send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
    assert read_message(s)["parameters"]["progress"]["state"] == "touch"
    conn = VirtualImage(sensor)
    if hold:
        conn.automatic_finger(False)
        conn.finger(True)
    started = time.monotonic()
    conn.send_print(print_name)
    if hold and not select.select([s], [], [], hold)[0]:
        conn.finger(False)  # no answer while the finger was down: lift it, then take the answer
    reply = read_message(s)
    elapsed = time.monotonic() - started
    if hold:
        time.sleep(max(0.0, hold - elapsed))
        conn.finger(False)
    conn.close()
    return reply, elapsed


@pytest.mark.skipif(not have_nist_prints(), reason="NIST prints not found (set KIOSKAUTH_TESTDATA)")
@pytest.mark.parametrize("layout", ["full", "staged", "compact-1"])
def test_identify_layouts_pick_the_right_person_and_reject_a_stranger(make_daemon, layout):
    d, sensor = start(make_daemon, "virtual_image", f"\n[Fingerprint]\nIdentifyLayout={layout}\n")
    # Enrolment order makes omar first and lena last in the roster before anyone unlocks.
    for name, finger in (("lena", "tented_arch"), ("sarah", "whorl"), ("omar", "loop-right")):
        enroll_image(d, sensor, name, finger)
    reply, _ = identify_image(d, sensor, "tented_arch-rot")
    assert reply["parameters"]["person"]["name"] == "lena", reply
    assert reply["parameters"]["rosterSize"] == 3
    reply, _ = identify_image(d, sensor, "whorl-rot")
    assert reply["parameters"]["person"]["name"] == "sarah", reply
    reply, _ = identify_image(d, sensor, "loop-right-mirror")
    assert reply["error"] == "io.kioskauth.NotIdentified", reply
    # A removed person's finger is not found any more (the reader's decoded gallery follows the roster).
    assert d.ctl("user", "remove", "sarah").returncode == 0
    reply, _ = identify_image(d, sensor, "whorl-rot")
    assert reply["error"] == "io.kioskauth.NotIdentified", reply


@pytest.mark.skipif(not have_nist_prints(), reason="NIST prints not found (set KIOSKAUTH_TESTDATA)")
def test_identify_answers_while_the_finger_is_still_on_the_reader(make_daemon):
    d, sensor = start(make_daemon, "virtual_image")
    enroll_image(d, sensor, "omar", "loop-right")
    reply, elapsed = identify_image(d, sensor, "loop-right-rot", hold=4.0)
    assert "person" in reply.get("parameters", {}), reply
    assert reply["parameters"]["person"]["name"] == "omar", reply
    assert elapsed < 3.0, f"the answer waited for the finger to be lifted ({elapsed:.1f} s)"
    # The reader finished that touch once the finger was lifted; the next identify works.
    reply, _ = identify_image(d, sensor, "loop-right-rot")
    assert reply["parameters"]["person"]["name"] == "omar", reply


def test_an_unknown_identify_layout_is_a_clear_startup_error(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nIdentifyLayout=sideways\n")
    d.start(expect_ready=False)
    assert d.wait_exit() != 0
    assert "IdentifyLayout=sideways" in d.log_text() and "staged" in d.log_text()
