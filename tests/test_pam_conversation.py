"""The PAM conversation on every path, against pam_fprintd's.

fprintd's own PAM test suite (tests/pam/test_pam_fprintd.py upstream) mapped scenario by
scenario onto pam_kioskauth.so: each `test_pam_*` test here is named after the upstream scenario
it maps and runs it with libfprint's virtual readers, the real daemon and real libpam, in the
module's finger-only mode (mode=verify, as pam_fprintd is finger-only). The other tests are the
failure paths as a caregiver meets them in the default conversation (finger, then the passcode).
Every test asserts the exact conversation and return code. pam/README.md has the comparison
table.
"""

import time

import pytest

from fprint_virtual import (DRIVERS, ERROR_GENERAL, RETRY_CENTER_FINGER, RETRY_TOO_SHORT, VirtualDevice, scan,
                            wait_for_socket)
from kioskauth_testing import FAST_HASH_CONFIG
from pam_support import MODULE, PAM_AUTHINFO_UNAVAIL, PAM_MAXTRIES, PAM_SUCCESS, Client, security_dir
from test_pam import (NOT_RECOGNISED, PASSCODE, TOUCH, add_person, audit, call, enroll,  # noqa: F401
                      module, pam, person, start)

FPRINTD = "fprintd-pam-test"  # the service name upstream's tests use
TIMED_OUT = "Fingerprint timed out: no finger was placed on the reader."
USE_PASSCODE = "Too many tries with the finger: use your passcode."
USE_NAME = "Too many tries with the finger: use your name and passcode."
WAIT = "Waiting for the fingerprint reader: another login is using it. Do not touch it yet."


def toto(make_daemon, pam, kind="virtual_device", config="", options=""):
    """A daemon with toto enrolled on a `kind` reader, and the finger-only service."""
    d, sensor = start(make_daemon, kind, config)
    add_person(d, "toto")
    enroll(d, sensor, "toto", "toto-finger")
    pam.kioskauth(FPRINTD, d.socket, f"mode=verify {options}")
    return d, sensor


# pam_fprintd's scenarios -------------------------------------------------------------------------


def test_pam_no_device(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "toto")
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == []


def test_pam_fprintd_identify_error(make_daemon, pam):
    """A reader error mid-scan: the stack goes on, nothing is counted against toto."""
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    VirtualDevice(sensor).error(ERROR_GENERAL)
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == [("info", TOUCH)]
    assert person(d, "toto")["fingerprintFailures"] == 0


def test_pam_fprintd_identify_error2(make_daemon, pam):
    """The reader unplugged mid-scan."""
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    VirtualDevice(sensor).unplug()
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == [("info", TOUCH)]


def test_pam_fprintd_auth(make_daemon, pam):
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    scan(sensor, "toto-finger")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "toto")]
    assert c.messages() == [("info", TOUCH)]


def test_pam_fprintd_no_fingers(make_daemon, pam):
    d, _ = start(make_daemon, "virtual_device")
    add_person(d, "toto")
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == []


def test_pam_fprintd_retry(make_daemon, pam):
    """Unusable touches (too short, off centre) are hints, not failed matches: more of them than
    max_tries still leave the next good touch its chance, and nothing is counted."""
    d, sensor = toto(make_daemon, pam)
    device = VirtualDevice(sensor)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    for code in (RETRY_TOO_SHORT, RETRY_CENTER_FINGER, RETRY_CENTER_FINGER):
        device.retry(code)
    scan(sensor, "toto-finger")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]
    assert c.messages() == [("info", TOUCH), ("error", "swipe too short, please try again"), ("info", TOUCH),
                            ("error", "centre your finger on the reader"), ("info", TOUCH),
                            ("error", "centre your finger on the reader"), ("info", TOUCH)]
    assert [e["result"] for e in audit(d, "finger.verify")][-1] == "success"


def test_pam_fprintd_last_try_auth(make_daemon, pam):
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    for finger in ("someone-else", "someone-else", "toto-finger"):
        c.expect(TOUCH)
        scan(sensor, finger)
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 2 + [("info", TOUCH)]


def test_pam_fprintd_failed_auth(make_daemon, pam):
    """Three misses: PAM_MAXTRIES, and the person is told what to use instead."""
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    for _ in range(3):
        c.expect(TOUCH)
        scan(sensor, "someone-else")
    assert [r["rc"] for r in c.results()] == [PAM_MAXTRIES]
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 3 + [("error", USE_PASSCODE)]


def test_pam_already_claimed(make_daemon, pam):
    """A second conversation while the first holds the reader: pam_fprintd returns
    PAM_AUTHINFO_UNAVAIL at once. Here the second waits its turn (timeout= bounds the wait), says
    that it waits, and asks for toto's touch only once its scan owns the reader, so no touch is
    charged to someone whose prompt was not shown."""
    d, sensor = toto(make_daemon, pam)
    add_person(d, "omar")
    enroll(d, sensor, "omar", "omar-finger")
    a = Client(pam, FPRINTD, "omar", "authenticate")
    a.expect(TOUCH)
    b = Client(pam, FPRINTD, "toto", "authenticate")
    b.expect_message(WAIT)
    time.sleep(0.5)
    assert b.messages() == [("info", WAIT)]  # no touch prompt while omar's scan holds the reader
    scan(sensor, "omar-finger")
    assert [(r["rc"], r["user"]) for r in a.results()] == [(PAM_SUCCESS, "omar")]
    b.expect(TOUCH)
    scan(sensor, "toto-finger")
    assert [(r["rc"], r["user"]) for r in b.results()] == [(PAM_SUCCESS, "toto")]
    assert b.messages() == [("info", WAIT), ("info", TOUCH)]
    assert a.messages() == [("info", TOUCH)]
    assert [(e["person"], e["result"]) for e in audit(d, "finger.verify")] == [("omar", "success"), ("toto", "success")]


def test_pam_timeout(make_daemon, pam):
    """No finger: the daemon's ScanTimeoutSec, or the module's timeout=, says so."""
    d, sensor = toto(make_daemon, pam, config="\n[Fingerprint]\nScanTimeoutSec=2\n")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == [("info", TOUCH), ("error", TIMED_OUT)]
    # The module's own bound (timeout=) ends the same way; in the default conversation the
    # passcode comes next.
    pam.kioskauth("kioskauth", d.socket, "timeout=1")
    c = Client(pam, "kioskauth", "toto", "authenticate")
    c.expect('"Passcode: "')
    c.send(PASSCODE)
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]
    assert c.messages() == [("info", TOUCH), ("error", TIMED_OUT), ("prompt_echo_off", "Passcode: ")]


def test_pam_notices_fprintd_disappearing(make_daemon, pam):
    """The daemon killed mid-scan."""
    d, sensor = toto(make_daemon, pam)
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    d.kill()
    [result] = c.results()
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL and result["seconds"] < 5
    assert c.messages() == [("info", TOUCH)]


# Several readers (pam_fprintd's dual-reader scenarios) --------------------------------------------


def readers(make_daemon, *drivers):
    """A daemon with one virtual reader of each driver at once (libfprint runs each virtual
    driver's one device side by side): the daemon and, per driver, (reader id, name, socket)."""
    d = make_daemon(config=FAST_HASH_CONFIG)
    sockets = {driver: d.root / f"{driver}.sock" for driver in drivers}
    d.extra_env.update({DRIVERS[driver]: str(path) for driver, path in sockets.items()})
    d.extra_env.update({"FP_DRIVERS_WHITELIST": ":".join(drivers), "FP_DRIVERS_ALLOWLIST": ":".join(drivers)})
    d.start()
    for path in sockets.values():
        wait_for_socket(path)
    listed = {r["driver"]: r for r in call(d, "GetReaders")["parameters"]["readers"]}
    assert sorted(listed) == sorted(drivers)
    return d, {driver: (listed[driver]["id"], listed[driver]["name"], sockets[driver]) for driver in drivers}


def enroll_on(d, reader, name, finger_id, finger):
    """Enrols `finger` on one reader (id, name, socket), touching it whenever it asks."""
    reader_id, _, sensor = reader
    return enroll(d, sensor, name, finger_id, finger=finger, reader=reader_id)


# Only the set of messages is compared: at this branch's base the daemon sends the touch prompt
# twice (once admitted, once the scan owns the reader), which main has since made once.
def touch_on(reader):
    """The touch prompt naming a reader, as shown when several are attached."""
    return f"{TOUCH} ({reader[1]})"


def test_pam_fprintd_dual_reader_auth(make_daemon, pam):
    """Two readers; toto's prints are on the one found second: the scan runs there, and the
    prompt names it."""
    d, r = readers(make_daemon, "virtual_device", "virtual_device_storage")
    first, second = [r[reader["driver"]] for reader in call(d, "GetReaders")["parameters"]["readers"]]
    add_person(d, "toto")
    enroll_on(d, second, "toto", "toto-left-middle", "left-middle")
    enroll_on(d, second, "toto", "toto-right-middle", "right-middle")
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(touch_on(second))
    scan(second[2], "toto-left-middle")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "toto")]
    assert set(c.messages()) == {("info", touch_on(second))}  # the prompt, and nothing else


def test_pam_fprintd_multi_reader_not_all_enrolled(make_daemon, pam):
    """Three readers: one with none of toto's prints, one with two, one with one. As pam_fprintd
    does, the scan runs on the reader holding most of them, and the prompt names it."""
    d, r = readers(make_daemon, "virtual_image", "virtual_device", "virtual_device_storage")
    add_person(d, "toto")
    enroll_on(d, r["virtual_device"], "toto", "toto-left-middle", "left-middle")
    enroll_on(d, r["virtual_device_storage"], "toto", "toto-left-index", "left-index")
    enroll_on(d, r["virtual_device_storage"], "toto", "toto-right-index", "right-index")
    most = r["virtual_device_storage"]
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(touch_on(most))
    scan(most[2], "toto-right-index")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "toto")]
    assert set(c.messages()) == {("info", touch_on(most))}  # the prompt, and nothing else


def test_a_reader_unplugged_leaves_the_prints_on_the_other(make_daemon, pam):
    """toto enrolled first on the storage reader, then on the other; with the storage reader
    unplugged, his print on the remaining reader unlocks him (one reader: the plain prompt).
    Someone enrolled only on the unplugged reader has no usable finger: the stack goes on."""
    d, r = readers(make_daemon, "virtual_device", "virtual_device_storage")
    add_person(d, "toto")
    add_person(d, "sarah")
    enroll_on(d, r["virtual_device_storage"], "toto", "toto-storage", "left-index")
    enroll_on(d, r["virtual_device"], "toto", "toto-plain", "right-index")
    enroll_on(d, r["virtual_device_storage"], "sarah", "sarah-storage", "right-index")
    VirtualDevice(r["virtual_device_storage"][2]).unplug()
    deadline = time.monotonic() + 10
    while len(call(d, "GetReaders")["parameters"]["readers"]) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "toto", "authenticate")
    c.expect(TOUCH)
    scan(r["virtual_device"][2], "toto-plain")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "toto")]
    assert set(c.messages()) == {("info", TOUCH)}  # the prompt, and nothing else
    c = Client(pam, FPRINTD, "sarah", "authenticate")
    assert [r["rc"] for r in c.results()] == [PAM_AUTHINFO_UNAVAIL]
    assert c.messages() == []
    [refusal] = [e for e in audit(d, "finger.verify") if e["result"] == "refused"]
    assert refusal["person"] == "sarah" and "not attached" in refusal["detail"]


def test_walk_up_identify_runs_on_the_reader_that_can_identify_the_roster(make_daemon, pam):
    """Walk-up identify with a verify-only reader found first: it runs on the reader that holds
    the roster's prints and can identify, over those prints, and the prompt names it."""
    d, r = readers(make_daemon, "virtual_device", "virtual_device_storage")
    assert call(d, "GetReaders")["parameters"]["readers"][0]["driver"] == "virtual_device"
    add_person(d, "sarah")
    add_person(d, "toto")
    enroll_on(d, r["virtual_device"], "toto", "toto-plain", "right-index")
    enroll_on(d, r["virtual_device_storage"], "sarah", "sarah-storage", "right-index")
    storage = r["virtual_device_storage"]
    pam.kioskauth("greeter-finger", d.socket, "mode=identify")
    c = Client(pam, "greeter-finger", None, "authenticate")
    c.expect(touch_on(storage))
    scan(storage[2], "sarah-storage")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "sarah")]
    assert set(c.messages()) == {("info", touch_on(storage)), ("info", "Welcome back, Sarah")}


# The failure paths of the default conversation -----------------------------------------------------


def test_ctrl_c_at_the_touch_prompt_lets_the_stack_fall_through(make_daemon, pam):
    """The man page's sudo stack: Ctrl-C at the touch prompt goes on to the next module (here
    pam_permit standing in for pam_unix), as pam_fprintd's PAM_AUTHINFO_UNAVAIL does."""
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.add("sudo", f"auth [success=done authinfo_unavail=ignore user_unknown=ignore default=die] {MODULE} "
                    f"socket={d.socket} timeout=30\n"
                    f"auth [success=done default=die] {security_dir() / 'pam_permit.so'}\n"
                    f"auth requisite {security_dir() / 'pam_deny.so'}\n")
    c = Client(pam, "sudo", "sarah", "authenticate")
    c.expect(TOUCH)
    c.interrupt()
    code = c.wait(60)
    results = [e for e in c.events() if e["event"] == "result"]
    assert len(results) == 1, (code, c.transcript)
    [result] = results
    assert result["rc"] == PAM_SUCCESS and result["seconds"] < 5
    assert c.messages() == [("info", TOUCH)]
    # Nothing was counted against her, and the reader is free again.
    assert person(d, "sarah")["fingerprintFailures"] == 0
    pam.kioskauth(FPRINTD, d.socket, "mode=verify")
    c = Client(pam, FPRINTD, "sarah", "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]


def test_walk_up_out_of_tries_goes_from_the_name_to_the_passcode(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage")
    add_person(d, "sarah", "Sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    c = Client(pam, "kioskauth", None, "authenticate")
    for _ in range(3):
        c.expect(TOUCH)
        scan(sensor, "stranger")
    c.expect('"Name: "')
    c.send("sarah")
    c.expect('"Passcode: "')
    c.send(PASSCODE)
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "sarah")]
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 3 + [
        ("error", USE_NAME), ("prompt_echo_on", "Name: "), ("prompt_echo_off", "Passcode: ")]
    assert audit(d, "finger.verify") == []  # no touch asked for after the name


def test_a_paused_identify_says_so_and_for_how_long(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage",
                      "\n[Fingerprint]\nIdentifyPauseAfter=2\nIdentifyPauseSec=600\n")
    add_person(d, "sarah", "Sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    c = Client(pam, "kioskauth", None, "authenticate")
    for _ in range(2):
        c.expect(TOUCH)
        scan(sensor, "stranger")
    c.expect('"Name: "')
    c.send("sarah")
    c.expect('"Passcode: "')
    c.send(PASSCODE)
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_SUCCESS, "sarah")]
    paused = ("Fingerprint unlock is paused after too many unknown fingers. Try again in 10 minutes, "
              "or use your name and passcode.")
    assert c.messages() == [("info", TOUCH), ("error", NOT_RECOGNISED)] * 2 + [
        ("error", paused), ("prompt_echo_on", "Name: "), ("prompt_echo_off", "Passcode: ")]
    # A finger-only greeter conversation says the same, without the keyboard's way in.
    pam.kioskauth("greeter-finger", d.socket, "mode=identify")
    c = Client(pam, "greeter-finger", None, "authenticate")
    assert [(r["rc"], r["user"]) for r in c.results()] == [(PAM_AUTHINFO_UNAVAIL, None)]
    [(style, text)] = c.messages()
    assert style == "error" and text.startswith(
        "Fingerprint unlock is paused after too many unknown fingers. Try again in ") and text.endswith(" minutes.")
