"""Reader faults mid-operation on libfprint's virtual_device_storage reader: `ERROR n` and
`UNPLUG` in the middle of an enrolment (after its first stage), a verify and an identify (while
they wait for the touch). Each ends the call with its named error, nothing hangs, and the next
request is served: by the reader after an error, with NoReader (and the passcode) after the
reader is gone."""

import time

import pytest

from fprint_virtual import ERROR_DATA_FULL, ERROR_GENERAL, ERROR_PROTO, ERROR_TOO_HOT, VirtualDevice, environment, scan
from kioskauth_testing import FAST_HASH_CONFIG, connect, read_message, send_message

CHECK_HINT = "touch the reader to check this finger is not already enrolled"

FAULTS = {
    # name: (fault, the error the interrupted call ends with)
    "error-general": (("ERROR", ERROR_GENERAL), "io.kioskauth.ReaderUnavailable"),
    "error-proto": (("ERROR", ERROR_PROTO), "io.kioskauth.ReaderUnavailable"),
    "error-too-hot": (("ERROR", ERROR_TOO_HOT), "io.kioskauth.ReaderUnavailable"),
    "error-data-full": (("ERROR", ERROR_DATA_FULL), "io.kioskauth.ReaderFull"),
    "unplug": (("UNPLUG", None), "io.kioskauth.ReaderRemoved"),
}


def start(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device_storage", sensor, base={}))
    d.start()
    for name in ("sarah", "omar"):
        assert d.ctl("user", "add", name).returncode == 0
    assert d.ctl("passcode", "set", "sarah", input="482913\n482913\n").returncode == 0
    return d, sensor


def begin(d, method, parameters):
    s = connect(d.socket, timeout=30)
    send_message(s, {"method": "io.kioskauth." + method, "parameters": parameters, "more": True})
    return s


def progress(reply):
    return (reply.get("parameters") or {}).get("progress")


def wants_touch(p):
    """Whether the reader waits for a finger after this progress report (as in
    test_fingerprint_e2e.py)."""
    if p["state"] == "duplicate-check":
        return p.get("hint") == CHECK_HINT
    return p.get("stage", 0) < p.get("stages", 1)


def finish(s, sensor, finger_id):
    """Touches whenever asked; returns the final reply."""
    while True:
        reply = read_message(s)
        if reply is None or "error" in reply or progress(reply) is None:
            return reply
        if wants_touch(progress(reply)):
            scan(sensor, finger_id)


def enrol(d, sensor, name, finger_id):
    reply = finish(begin(d, "EnrollFinger", {"name": name, "finger": "right-index"}), sensor, finger_id)
    assert "error" not in reply, reply
    return reply


def inject(sensor, fault):
    command, code = fault
    device = VirtualDevice(sensor)
    if command == "UNPLUG":
        device.unplug()
    else:
        device.error(code)


def until_touch(s, sensor, finger_id, stages_before):
    """Reads progress until the reader waits for a touch, touching `stages_before` times first."""
    touched = 0
    while True:
        reply = read_message(s)
        assert reply is not None and "error" not in reply, reply
        if wants_touch(progress(reply)):
            if touched == stages_before:
                return
            scan(sensor, finger_id)
            touched += 1


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("operation", ["enrol", "verify", "identify"])
def test_a_reader_fault_mid_operation_is_named_and_the_next_request_is_served(make_daemon, operation, fault):
    d, sensor = start(make_daemon)
    enrol(d, sensor, "sarah", "sarah-finger")
    command, expected = FAULTS[fault]
    if operation == "enrol":
        # Past the duplicate check and the first stage: the fault comes with the second touch.
        s = begin(d, "EnrollFinger", {"name": "omar", "finger": "right-index"})
        until_touch(s, sensor, "omar-finger", stages_before=2)
    elif operation == "verify":
        s = begin(d, "VerifyFinger", {"name": "sarah"})
        until_touch(s, sensor, "sarah-finger", stages_before=0)
    else:
        s = begin(d, "Identify", {})
        until_touch(s, sensor, "sarah-finger", stages_before=0)
    started = time.monotonic()
    inject(sensor, command)
    reply = read_message(s)
    while reply is not None and "error" not in reply and progress(reply) is not None:
        reply = read_message(s)
    assert reply is not None and reply.get("error") == expected, reply
    assert time.monotonic() - started < 5
    s.close()

    # Nothing was counted against anyone.
    person = d.call("io.kioskauth.GetPerson", {"name": "sarah"})["parameters"]["person"]
    assert person["fingerprintFailures"] == 0, person

    if command[0] == "UNPLUG":
        # The reader is gone: the next scan is refused by name at once, the passcode works.
        started = time.monotonic()
        again = d.call("io.kioskauth.VerifyFinger", {"name": "sarah"})
        assert again.get("error") in ("io.kioskauth.NoReader", "io.kioskauth.ReaderRemoved"), again
        assert time.monotonic() - started < 5
        assert "error" not in d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
        return
    # The reader still works: the same request again is served.
    if operation == "enrol":
        reply = enrol(d, sensor, "omar", "omar-finger")
        assert reply["parameters"]["finger"] == "right-index"
    elif operation == "verify":
        reply = finish(begin(d, "VerifyFinger", {"name": "sarah"}), sensor, "sarah-finger")
        assert reply["parameters"]["person"]["name"] == "sarah", reply
    else:
        reply = finish(begin(d, "Identify", {}), sensor, "sarah-finger")
        assert reply["parameters"]["person"]["name"] == "sarah", reply
