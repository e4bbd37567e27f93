"""Attacks of the review after issue #11, replayed end to end against the real daemon and
libfprint's virtual readers. Each test is one attack: it failed on the code it was written
against, and passes once the fix landed.
"""

import json
import subprocess
import sys
import time

import pytest

from fprint_virtual import environment, scan
from kioskauth_testing import FAST_HASH_CONFIG, RAW_CLIENT, as_user, connect, read_message, send_message
from test_fingerprint_e2e import enroll
from test_pam import unix_user  # noqa: F401 (fixture)


def start(make_daemon, kind="virtual_device_storage", config=""):
    d = make_daemon(config=FAST_HASH_CONFIG + config)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment(kind, sensor, base={}))
    d.start()
    return d, sensor


def error(reply):
    return reply.get("error", "").removeprefix("io.kioskauth.")


def enrolled(d, sensor, name, finger_id):
    reply, _ = enroll(d, sensor, name, finger_id)
    assert reply.get("parameters", {}).get("finger") == "right-index", reply


def test_a_person_suspended_while_her_scan_waits_is_not_authenticated(make_daemon):
    """VerifyFinger checks that the person is active before the scan, then waits (up to
    ScanTimeoutSec) for a finger. An admin suspends her meanwhile (sessions ended, tickets
    voided); her touch must not then unlock her and hand out a fresh ticket."""
    d, sensor = start(make_daemon)
    assert d.ctl("user", "add", "sarah").returncode == 0
    enrolled(d, sensor, "sarah", "sarah-finger")

    s = connect(d.socket, timeout=30)
    send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": "sarah"}, "more": True})
    assert read_message(s)["parameters"]["progress"]["state"] == "touch"
    suspended = d.call("io.kioskauth.SuspendPerson", {"name": "sarah", "reason": "left the clinic"})
    assert suspended["parameters"]["person"]["state"] == "suspended", suspended
    scan(sensor, "sarah-finger")
    reply = read_message(s)
    s.close()
    assert error(reply) == "PersonNotActive", reply
    assert "ticket" not in (reply.get("parameters") or {})
    successes = [e for e in json.loads(d.ctl("audit", "--json").stdout)["events"]
                 if e["action"] == "finger.verify" and e["result"] == "success"]
    assert successes == []


def test_an_unprivileged_scan_does_not_take_the_greeters_touch(make_daemon, unix_user):
    """A bound user, from anywhere (a raw client sends no login context, so an SSH login looks
    local), keeps a VerifyFinger of her own waiting on the reader. Walk-up identify at the greeter
    queues behind it, so the next colleague's touch is matched against the attacker's print:
    not recognised, counted towards the terminal-wide pause, and the greeter never sees it. Five
    such touches pause fingerprints for everyone. A privileged scan must take the reader from an
    unprivileged one."""
    d, sensor = start(make_daemon, config="\n[Fingerprint]\nIdentifyPauseAfter=5\nIdentifyPauseSec=60\n")
    assert d.ctl("user", "add", "sarah").returncode == 0
    enrolled(d, sensor, "sarah", "sarah-finger")
    mallory, mallory_uid = unix_user()
    assert "error" not in d.call("io.kioskauth.AddPerson", {"name": mallory, "uid": mallory_uid})
    enrolled(d, sensor, mallory, "mallory-finger")

    request = {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": mallory}, "more": True}
    attacker = subprocess.Popen(as_user([sys.executable, str(RAW_CLIENT), d.socket], mallory),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        attacker.stdin.write(json.dumps(request))
        attacker.stdin.close()
        assert json.loads(attacker.stdout.readline())["parameters"]["progress"]["state"] == "touch"

        greeter = connect(d.socket, timeout=10)
        send_message(greeter, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
        # The greeter may first be told the reader is busy; its prompt comes once it owns it.
        progress = read_message(greeter)["parameters"]["progress"]
        if progress["state"] == "wait":
            progress = read_message(greeter)["parameters"]["progress"]
        assert progress["state"] == "touch", progress
        time.sleep(0.5)
        scan(sensor, "sarah-finger")
        try:
            reply = read_message(greeter)
        except TimeoutError:
            reply = {"error": "the greeter never saw the touch"}
        greeter.close()
        assert reply.get("parameters", {}).get("person", {}).get("name") == "sarah", reply
        # The attacker's scan was taken from her, not matched against sarah's touch.
        taken = json.loads(attacker.stdout.readline())
        assert error(taken) == "ScanCancelled", taken
    finally:
        attacker.kill()
        attacker.wait()
    # Nothing counted towards the pause.
    events = json.loads(d.ctl("audit", "--json").stdout)["events"]
    assert not [e for e in events if e["action"] == "finger.verify" and e["result"] == "failure"
                and "no match" in (e.get("detail") or "")]


def test_genuine_touches_between_guesses_do_not_buy_unlimited_guesses(make_daemon, unix_user):
    """Failed matches count per attempt, and the terminal-wide run of unknown fingers is reset by
    any match. So an attacker guesses at sarah's finger four times (each a new connection), then
    touches her own enrolled finger to reset the run, and again: unlimited guesses. The sliding
    window ([Fingerprint] FailuresInWindow=10 in FailureWindowSec=600) counts failures whatever
    came between them: the tenth pauses fingerprint matching, and so does every further one."""
    d, sensor = start(make_daemon, config="\n[Fingerprint]\nIdentifyPauseAfter=5\nIdentifyPauseSec=60\n")
    assert d.ctl("user", "add", "sarah").returncode == 0
    enrolled(d, sensor, "sarah", "sarah-finger")
    mallory, mallory_uid = unix_user()
    assert "error" not in d.call("io.kioskauth.AddPerson", {"name": mallory, "uid": mallory_uid})
    enrolled(d, sensor, mallory, "mallory-finger")

    def touch(name, finger):
        s = connect(d.socket, timeout=30)
        send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": name}, "more": True})
        first = read_message(s)
        if "error" in first:
            s.close()
            return error(first)
        assert first["parameters"]["progress"]["state"] == "touch", first
        scan(sensor, finger)
        reply = read_message(s)
        s.close()
        return error(reply) or "matched"

    outcomes = []
    for _ in range(4):
        for _ in range(4):
            outcomes.append(touch("sarah", "stranger-finger"))
        outcomes.append(touch(mallory, "mallory-finger"))
        if outcomes[-1] == "FingerprintPaused":
            break
    guesses = [o for o in outcomes if o == "FingerprintNotRecognized"]
    assert len(guesses) == 10, outcomes
    assert outcomes[-1] == "FingerprintPaused", outcomes
