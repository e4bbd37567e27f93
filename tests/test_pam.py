"""pam_kioskauth.so in real libpam against the real daemon and libfprint's virtual readers.

Two PAM clients load the module: pamtester under pam_wrapper, and libpam through ctypes with
pam_start_confdir (tests/pam_support.py). Each test starts its own daemon, so the virtual
drivers' overheating model never trips. The tests run as root, so the daemon's peer is root.
"""

import os
import pwd
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from fprint_virtual import environment, scan
from kioskauth_testing import FAST_HASH_CONFIG
from pam_support import (MODULE, PAM_ACCT_EXPIRED, PAM_AUTH_ERR, PAM_AUTHINFO_UNAVAIL, PAM_CONV_ERR,
                         PAM_MAXTRIES, PAM_PERM_DENIED, PAM_SUCCESS, PAM_USER_UNKNOWN, REPO, Client, PamConfig,
                         Pamtester, VarlinkConnection, enroll, module_build, run_pamtester, security_dir, stale_socket)

PASSCODE = "482913"
TOUCH = "Touch the fingerprint reader"
NOT_RECOGNISED = "Fingerprint not recognised."
WAIT_FOR_READER = "Waiting for the fingerprint reader: another login is using it. Do not touch it yet."
# Each shipped stack under a service name it would be installed as.
SHIPPED_STACKS = {"kioskauth": REPO / "pam" / "pam.d" / "kioskauth",
                  "lightdm": REPO / "pam" / "examples" / "greeter",
                  "swaylock": REPO / "pam" / "examples" / "screenlocker",
                  "sudo": REPO / "pam" / "examples" / "sudo"}


@pytest.fixture(scope="session")
def module():
    return module_build()


@pytest.fixture
def pam(tmp_path, module):
    return PamConfig(tmp_path)


@pytest.fixture
def unix_user():
    """Makes Unix accounts (uids from UID_MIN, above SYS_UID_MAX); removes them afterwards."""
    made = []

    def make(name=None):
        name = name or f"kb{uuid.uuid4().hex[:8]}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        made.append(name)
        return name, pwd.getpwnam(name).pw_uid

    yield make
    for name in made:
        subprocess.run(["userdel", name], check=False)


def start(make_daemon, kind=None, config=""):
    """A daemon with one virtual reader of `kind`, or with no reader at all."""
    d = make_daemon(config=FAST_HASH_CONFIG + config)
    sensor = d.root / "sensor.sock"
    if kind:
        d.extra_env.update(environment(kind, sensor, base={}))
    else:
        d.extra_env.update({"FP_DRIVERS_WHITELIST": "virtual_device", "FP_DRIVERS_ALLOWLIST": "virtual_device"})
    d.start()
    return d, sensor


def call(d, method, parameters=None):
    connection = VarlinkConnection(d.socket)
    connection.send({"method": f"io.kioskauth.{method}", "parameters": parameters or {}})
    reply = connection.receive()
    connection.close()
    return reply


def add_person(d, name, display=None, passcode=PASSCODE, uid=None):
    parameters = {"name": name, "displayName": display or name.title()}
    if uid is not None:
        parameters["uid"] = uid
    assert "error" not in call(d, "AddPerson", parameters)
    if passcode:
        r = call(d, "SetPasscode", {"name": name, "passcode": passcode, "confirmation": passcode})
        assert "error" not in r, r
    return name


def person(d, name):
    return call(d, "GetPerson", {"name": name})["parameters"]["person"]


def audit(d, action):
    events = call(d, "GetAudit", {})["parameters"]["events"]
    return [e for e in events if e["action"] == action]


# The module itself ------------------------------------------------------------------------------


def test_only_the_pam_entry_points_are_exported(module):
    out = subprocess.run(["nm", "-D", "--defined-only", str(module)], capture_output=True, text=True, check=True)
    symbols = sorted(line.split()[-1] for line in out.stdout.splitlines() if line.strip())
    assert symbols == sorted(["pam_sm_acct_mgmt", "pam_sm_authenticate", "pam_sm_chauthtok", "pam_sm_close_session",
                              "pam_sm_open_session", "pam_sm_setcred"])
    # And as the dynamic linker sees it: dlopen() the module, look names up.
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]);"
             "print(hasattr(lib, 'pam_sm_authenticate'), hasattr(lib, 'json_parse'), hasattr(lib, 'parse_options'))")
    out = subprocess.run([sys.executable, "-c", probe, str(module)], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "LD_PRELOAD": " ".join(os.environ.get("KIOSKAUTH_PAM_PRELOAD", "").split()),
                              "ASAN_OPTIONS": "detect_leaks=0"})
    assert out.stdout.split() == ["True", "False", "False"], out.stderr


def test_json_writer_and_reader_under_the_sanitizers():
    out = subprocess.run(["make", "-s", "-C", str(REPO / "pam"), "json-check"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "json-check: ok" in out.stdout


def test_the_c_sources_are_formatted():
    out = subprocess.run(["make", "-s", "-C", str(REPO / "pam"), "format-check"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_daemon_not_running_is_authinfo_unavail_within_a_second(pam, tmp_path):
    for socket_path in (tmp_path / "absent", stale_socket(tmp_path / "stale")):
        pam.kioskauth("kioskauth", str(socket_path))
        p = run_pamtester(pam, "kioskauth", "sarah", "authenticate")
        assert p.result() == PAM_AUTHINFO_UNAVAIL
        assert p.elapsed < 1.0, p.elapsed
        c = Client(pam, "kioskauth", None, "authenticate")
        [result] = c.results()
        assert result["rc"] == PAM_AUTHINFO_UNAVAIL and result["seconds"] < 1.0 and result["user"] is None
        assert c.messages() == []


def test_a_stopped_daemon_answers_fast_too(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    assert run_pamtester(pam, "kioskauth", "sarah", "authenticate", answers=[("Passcode: ", PASSCODE)]).result() == 0
    d.stop()
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate")
    assert p.result() == PAM_AUTHINFO_UNAVAIL and p.elapsed < 1.0
    assert "Passcode: " not in p.err


def test_unknown_options_are_logged_and_ignored_and_the_environment_is_not_trusted(make_daemon, pam, tmp_path):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    # The real socket is in the environment (as a setuid program's caller could arrange) but
    # the module only believes its option.
    pam.kioskauth("kioskauth", str(tmp_path / "absent"), "mode=passcode frobnicate=1 timeout=abc")
    # (pam_wrapper prints pam_syslog() to stderr at debug level 2.)
    p = Pamtester(pam, "kioskauth", "sarah", "authenticate",
                  extra_env={"PAM_WRAPPER_DEBUGLEVEL": "2", "KIOSKAUTH_SOCKET": d.socket})
    assert p.result() == PAM_AUTHINFO_UNAVAIL
    assert "Unknown option: frobnicate=1, ignoring" in p.err
    assert "timeout= takes 1-600 seconds: timeout=abc, ignoring" in p.err
    assert f"Cannot connect to kioskauthd at {tmp_path / 'absent'}" in p.err
    assert audit(d, "passcode.verify") == []


def test_a_socket_served_by_someone_else_is_refused_before_anything_is_sent(pam, tmp_path):
    """A listener running as nobody (a socket= path in a directory others can write to, say):
    the module checks SO_PEERCRED and never sends the passcode."""
    shared = Path(tempfile.mkdtemp(prefix="kioskauth-fake-"))
    shared.chmod(0o777)
    sock = shared / "io.kioskauth"
    received = shared / "received"
    listener = subprocess.Popen(
        ["timeout", "30", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "import socket, sys\n"
         "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); s.settimeout(20)\n"
         "print('listening', flush=True)\n"
         "c, _ = s.accept(); c.settimeout(5); data = b''\n"
         "try:\n"
         "    while chunk := c.recv(4096): data += chunk\n"
         "except OSError: pass\n"
         "open(sys.argv[2], 'wb').write(data)\n",
         str(sock), str(received)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        pam.kioskauth("kioskauth", str(sock), "mode=passcode")
        p = run_pamtester(pam, "kioskauth", "sarah", "authenticate")
        assert p.result() == PAM_AUTHINFO_UNAVAIL
        assert "Passcode" not in p.err  # refused before a passcode was even asked for
        listener.wait(30)
        assert received.read_bytes() == b""
    finally:
        listener.kill()
        listener.wait()


def test_a_name_the_daemon_could_not_manage_is_user_unknown_without_asking(pam, tmp_path):
    pam.kioskauth("kioskauth", str(tmp_path / "absent"))
    for user in ("Sarah", "-rf", "a" * 65, "sa rah"):
        p = run_pamtester(pam, "kioskauth", user, "authenticate")
        assert p.result() == PAM_USER_UNKNOWN, user


# Walk-up identify, verify, fallback -------------------------------------------------------------


def test_walk_up_identify_sets_pam_user_and_welcomes(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage")
    add_person(d, "sarah", "Sarah")
    add_person(d, "omar", "Omar")
    enroll(d, sensor, "sarah", "sarah-finger")
    enroll(d, sensor, "omar", "omar-finger")
    pam.kioskauth("kioskauth", d.socket)

    c = Client(pam, "kioskauth", None, "authenticate", "acct_mgmt")
    c.expect(TOUCH)
    scan(sensor, "omar-finger")
    results = c.results()
    assert [(r["op"], r["rc"], r["user"]) for r in results] == [("authenticate", 0, "omar"), ("acct_mgmt", 0, "omar")]
    assert c.messages() == [("info", TOUCH), ("info", "Welcome back, Omar")]

    # pamtester starts with an empty user name: the same walk-up; pam_echo shows PAM_USER.
    pam.kioskauth("walkup", d.socket, extra=f"auth optional {security_dir() / 'pam_echo.so'} user=%u\n")
    p = Pamtester(pam, "walkup", "", "authenticate")
    p.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert p.result() == PAM_SUCCESS
    assert "Welcome back, Sarah\nuser=sarah\n" in p.out


def test_walk_up_with_an_unknown_finger_leaves_pam_user_unset_then_asks_the_name(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device_storage")
    add_person(d, "sarah", "Sarah")
    enroll(d, sensor, "sarah", "sarah-finger")

    # Finger only: after max_tries unknown fingers, no user, no success.
    pam.kioskauth("greeter-finger", d.socket, "mode=identify max_tries=2")
    c = Client(pam, "greeter-finger", None, "authenticate")
    for _ in range(2):
        c.expect(TOUCH)
        scan(sensor, "stranger")
        c.expect(NOT_RECOGNISED)
    [result] = c.results()
    assert result["rc"] == PAM_MAXTRIES and result["user"] is None

    # auto, no finger in time: the name is asked for, then that person's finger is verified.
    # (After unknown fingers the passcode follows the name: tests/test_pam_conversation.py.)
    pam.kioskauth("kioskauth", d.socket, "timeout=2")
    c = Client(pam, "kioskauth", None, "authenticate")
    c.expect(TOUCH)
    c.expect('"Name: "')
    c.send("Sarah")  # the daemon's names are lowercase; so is PAM_USER
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    [result] = c.results()
    assert result["rc"] == PAM_SUCCESS and result["user"] == "sarah"
    assert [e["action"] for e in call(d, "GetAudit", {})["parameters"]["events"] if e["action"].startswith("finger.")][-2:] \
        == ["finger.identify", "finger.verify"]


def test_verify_a_named_person(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    p = Pamtester(pam, "kioskauth", "sarah", "authenticate", "acct_mgmt")
    p.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert p.result() == PAM_SUCCESS
    assert "Passcode" not in p.transcript
    [event] = audit(d, "finger.verify")
    assert event["result"] == "success" and event["service"] == "kioskauth"


def test_three_failed_matches_fall_back_to_the_passcode(make_daemon, pam):
    # Six unknown fingers in a row here: above the terminal-wide pause's default of five.
    d, sensor = start(make_daemon, "virtual_device", config="\n[Fingerprint]\nIdentifyPauseAfter=10\n")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    p = Pamtester(pam, "kioskauth", "sarah", "authenticate")
    for _ in range(3):
        p.expect(TOUCH)
        scan(sensor, "someone-else")
        p.expect(NOT_RECOGNISED, "err")
    p.expect("Passcode: ", "err")
    assert p.out.count(TOUCH) == 3
    p.send(PASSCODE)
    assert p.result() == PAM_SUCCESS
    assert person(d, "sarah")["fingerprintFailures"] == 0  # the passcode success cleared them

    # Finger only (a greeter's finger conversation): the fallback is the next stack's business.
    pam.kioskauth("finger-only", d.socket, "mode=verify")
    p = Pamtester(pam, "finger-only", "sarah", "authenticate")
    for _ in range(3):
        p.expect(TOUCH)
        scan(sensor, "someone-else")
        p.expect(NOT_RECOGNISED, "err")
    assert p.result() == PAM_MAXTRIES
    assert "Passcode" not in p.err
    # The count belonged to that conversation, not to sarah: the next one asks for a touch, and
    # her own finger lets her in.
    p = Pamtester(pam, "finger-only", "sarah", "authenticate")
    p.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert p.result() == PAM_SUCCESS


def test_absent_reader_means_the_passcode_prompt_and_no_error_text(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", answers=[("Passcode: ", PASSCODE)])
    assert p.result() == PAM_SUCCESS
    assert p.out == "pamtester: successfully authenticated\n"
    assert p.err == "Passcode: "

    # Walk-up without a reader: the name, then the passcode; nothing else is said.
    c = Client(pam, "kioskauth", None, "authenticate")
    c.send("sarah")
    c.send(PASSCODE)
    [result] = c.results()
    assert result["rc"] == PAM_SUCCESS and result["user"] == "sarah"
    assert c.messages() == [("prompt_echo_on", "Name: "), ("prompt_echo_off", "Passcode: ")]


def test_no_enrolled_finger_goes_straight_to_the_passcode(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", answers=[("Passcode: ", PASSCODE)])
    assert p.result() == PAM_SUCCESS and TOUCH not in p.out and p.err == "Passcode: "


def test_passcode_lockout_is_explained(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate",
                      answers=[("Passcode: ", "111111"), ("Passcode: ", "222222"), ("Passcode: ", "333333")])
    assert p.result() == PAM_MAXTRIES
    assert p.err.count("Wrong passcode.\n") == 2
    assert "Wrong passcode. Too many attempts. Try again in 1 minute.\n" in p.err
    # The next conversation is told at once, and the right passcode is not even asked for.
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate")
    assert p.result() == PAM_MAXTRIES
    assert re.search(r"Too many wrong passcodes\. Try again in (1 minute|[1-5]?[0-9] seconds)\.\n", p.err), p.err
    assert "Passcode: " not in p.err
    assert person(d, "sarah")["passcodeFailures"] == 3


def test_unknown_person_is_user_unknown(make_daemon, pam):
    d, _ = start(make_daemon)
    pam.kioskauth("kioskauth", d.socket)
    assert run_pamtester(pam, "kioskauth", "nobody-here", "authenticate").result() == PAM_USER_UNKNOWN


def test_a_conversation_that_fails_is_conv_err(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", "sarah", "authenticate")
    [result] = c.results()  # stdin closed: the conversation fails at the prompt
    assert result["rc"] == PAM_CONV_ERR
    assert audit(d, "passcode.verify") == []


# Who may use what ---------------------------------------------------------------------------------


def test_remote_sessions_get_no_fingerprints(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket)
    p = run_pamtester(pam, "kioskauth", "sarah", "authenticate", items={"rhost": "laptop.example.org"})
    assert p.result() == PAM_AUTHINFO_UNAVAIL
    assert TOUCH not in p.out and "Passcode" not in p.err
    [event] = audit(d, "finger.verify")
    # The detail also says what logind answered (here: no logind, so "unavailable").
    assert event["result"] == "refused"
    assert event["detail"].startswith("fingerprints are not accepted over remote sessions; logind: ")
    # Walk-up too.
    c = Client(pam, "kioskauth", None, "authenticate", items={"rhost": "10.1.2.3"})
    [result] = c.results()
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL and result["user"] is None
    # A passcode typed over a remote session is refused as well.
    pam.kioskauth("remote-passcode", d.socket, "mode=passcode")
    p = run_pamtester(pam, "remote-passcode", "sarah", "authenticate", items={"rhost": "laptop.example.org"},
                      answers=[("Passcode: ", PASSCODE)])
    assert p.result() == PAM_AUTHINFO_UNAVAIL
    assert "Passcode not accepted: passcodes are not accepted over remote sessions." in p.err
    # The local machine by name is not remote.
    for host in ("localhost", socket.gethostname()):
        p = Pamtester(pam, "kioskauth", "sarah", "authenticate", items={"rhost": host, "tty": "tty7"})
        p.expect(TOUCH)
        scan(sensor, "sarah-finger")
        assert p.result() == PAM_SUCCESS


def test_a_service_not_on_the_allow_list_gets_no_passcode(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("cron", d.socket, "mode=passcode")
    p = run_pamtester(pam, "cron", "sarah", "authenticate", answers=[("Passcode: ", PASSCODE)])
    assert p.result() == PAM_AUTHINFO_UNAVAIL
    assert "Passcode not accepted: the PAM service cron is not allowed to use passcodes.\n" in p.err
    [event] = audit(d, "passcode.verify")
    assert event["result"] == "refused" and event["service"] == "cron"
    assert person(d, "sarah")["passcodeFailures"] == 0


def test_su_accepts_only_the_invoking_users_own_passcode(make_daemon, pam, unix_user):
    d, _ = start(make_daemon)
    add_person(d, "sarah", uid=4242)  # someone else: the tests run as root (ruid 0)
    account, uid = unix_user()
    add_person(d, account, uid=uid)
    for service in ("su", "sudo"):
        pam.kioskauth(service, d.socket, "mode=passcode")
        p = run_pamtester(pam, service, "sarah", "authenticate", answers=[("Passcode: ", PASSCODE)])
        assert p.result() == PAM_AUTHINFO_UNAVAIL
        assert f"Passcode not accepted: {service} accepts a passcode only for the invoking user.\n" in p.err
        # The invoking user (real uid theirs, effective uid root, as under su) to their own account.
        c = Client(pam, service, account, "authenticate", run_as=["setpriv", f"--ruid={uid}", "--"])
        c.send(PASSCODE)
        assert [r["rc"] for r in c.results()] == [PAM_SUCCESS]
    refused = [e for e in audit(d, "passcode.verify") if e["result"] == "refused"]
    assert [(e["person"], e["service"]) for e in refused] == [("sarah", "su"), ("sarah", "sudo")]
    assert person(d, "sarah")["passcodeFailures"] == 0


# account ----------------------------------------------------------------------------------------


def test_account_refuses_after_our_auth_when_the_daemon_is_gone(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", "sarah", "authenticate", "pause", "acct_mgmt")
    c.send(PASSCODE)
    c.expect('"paused"')
    d.stop()
    c.send("")
    results = c.results()
    assert [(r["op"], r["rc"]) for r in results] == [("authenticate", 0), ("acct_mgmt", PAM_PERM_DENIED)]
    assert ("error", "The login service is not available.") in c.messages()

    # When another module authenticated, an unreachable daemon is not this module's call.
    pam.add("other-auth", f"auth required {security_dir() / 'pam_permit.so'}\n"
                          f"account [success=ok ignore=ignore default=bad] {MODULE} socket={d.socket}\n"
                          f"account required {security_dir() / 'pam_permit.so'}\n")
    c = Client(pam, "other-auth", "sarah", "authenticate", "acct_mgmt")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SUCCESS]


def test_account_refuses_people_removed_or_not_active(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    add_person(d, "omar")
    add_person(d, "newbie", passcode=None)  # provisioned, not activated yet
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    c = Client(pam, "kioskauth", "sarah", "authenticate", "pause", "acct_mgmt")
    c.send(PASSCODE)
    c.expect('"paused"')
    assert "error" not in call(d, "RemovePerson", {"name": "sarah"})
    c.send("")
    assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_PERM_DENIED]
    assert ("error", "Your account was removed from this terminal.") in c.messages()

    assert "error" not in call(d, "SuspendPerson", {"name": "omar", "reason": "left the ward"})
    # account: CheckAccount's own one-line reason; suspended is PAM_ACCT_EXPIRED, not activated yet
    # PAM_PERM_DENIED.
    for name, code, reason in (
            ("omar", PAM_ACCT_EXPIRED, "Your account is suspended on this terminal. Ask your coordinator."),
            ("newbie", PAM_PERM_DENIED, "Your account is not activated yet: enter your activation code first.")):
        assert person(d, name)["state"] != "active"
        p = run_pamtester(pam, "kioskauth", name, "acct_mgmt")
        assert p.result() == code
        assert p.err.splitlines()[0] == reason
    # Nor may omar authenticate; his passcode is not even asked for.
    p = run_pamtester(pam, "kioskauth", "omar", "authenticate")
    assert p.result() == PAM_AUTH_ERR and p.err.splitlines()[0] == "Your account is suspended."
    # newbie is asked for an activation code instead of a passcode (tests/test_pam_activation.py
    # has the rest); no answer, no login.
    p = run_pamtester(pam, "kioskauth", "newbie", "authenticate", answers=[("Activation code: ", "")])
    assert p.result() == PAM_AUTH_ERR
    assert "Your account is not set up yet. Enter the activation code you were given.\n" in p.out
    assert "Passcode" not in p.err
    # Someone the daemon does not manage, and nobody authenticated here: the next module decides.
    assert run_pamtester(pam, "kioskauth", "stranger", "acct_mgmt").result() == PAM_USER_UNKNOWN


# chauthtok --------------------------------------------------------------------------------------


def test_change_passcode_with_weak_code_refusal(make_daemon, pam):
    d, _ = start(make_daemon)
    add_person(d, "sarah")
    weak = call(d, "SetPasscode", {"name": "sarah", "passcode": "123456", "confirmation": "123456"})
    assert weak["error"] == "io.kioskauth.WeakPasscode"
    pam.kioskauth("kioskauth", d.socket, "mode=passcode")
    p = run_pamtester(pam, "kioskauth", "sarah", "chauthtok",
                      answers=[("Current passcode: ", PASSCODE), ("New passcode: ", "123456"),
                               ("Retype new passcode: ", "123456"), ("New passcode: ", "275018"),
                               ("Retype new passcode: ", "275018")])
    assert p.result() == PAM_SUCCESS, p.transcript
    assert weak["parameters"]["message"] + "\n" in p.err
    assert "Passcode changed.\n" in p.out
    assert run_pamtester(pam, "kioskauth", "sarah", "authenticate",
                         answers=[("Passcode: ", "275018")]).result() == PAM_SUCCESS
    assert run_pamtester(pam, "kioskauth", "sarah", "authenticate",
                         answers=[("Passcode: ", PASSCODE), ("Passcode: ", "")]).result() == PAM_AUTH_ERR

    # A wrong current passcode changes nothing.
    p = run_pamtester(pam, "kioskauth", "sarah", "chauthtok", answers=[("Current passcode: ", "999999")])
    assert p.result() == PAM_PERM_DENIED and "Wrong passcode.\n" in p.err and "New passcode" not in p.err
    # Confirmation that does not match.
    c = Client(pam, "kioskauth", "sarah", "chauthtok")
    for line in ("275018", "402817", "402871"):
        c.send(line)
    c.close_input()
    [result] = c.results()
    assert result["rc"] == PAM_CONV_ERR  # asked again after the mismatch; stdin had no more
    assert any(style == "error" for style, _ in c.messages())
    assert [e["result"] for e in audit(d, "passcode.set")][-1] == "refused"


# Concurrency and interruption ---------------------------------------------------------------------


def test_twenty_concurrent_conversations_share_one_reader_first_come_first_served(make_daemon, pam):
    """The daemon serialises reader operations in arrival order: the first conversation is told
    to touch, each later one that it waits for the reader, and is told to touch only when its
    scan owns the reader. Each conversation is started after the previous one showed its first
    line, and the touches come in the same order, each after its conversation was told to touch:
    with FIFO service each finger reaches its own person's conversation (max_tries=1, so one
    misrouted touch fails that conversation)."""
    d, sensor = start(make_daemon, "virtual_device")
    people = [f"p{i:02d}" for i in range(20)]
    for name in people:
        add_person(d, name)
        enroll(d, sensor, name, f"{name}-finger")
    pam.kioskauth("kioskauth", d.socket, "mode=verify max_tries=1")
    conversations = []
    for i, name in enumerate(people):
        p = Pamtester(pam, "kioskauth", name, "authenticate", timeout=120)
        p.expect(TOUCH if i == 0 else WAIT_FOR_READER)
        conversations.append(p)
    for i, (name, p) in enumerate(zip(people, conversations)):
        # Everyone after this one is still waiting for the reader, and was not asked to touch.
        assert all(q.proc.poll() is None for q in conversations[i:])
        assert all(TOUCH not in q.out for q in conversations[i + 1:])
        if i > 0:
            p.expect(TOUCH)
        scan(sensor, f"{name}-finger")
        assert p.result(timeout=60) == PAM_SUCCESS, (name, p.transcript)
    verified = [e["person"] for e in audit(d, "finger.verify") if e["result"] == "success"]
    assert verified == people


def test_a_signal_ends_the_wait_and_frees_the_reader(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket, "mode=verify")
    c = Client(pam, "kioskauth", "sarah", "authenticate")
    c.expect(TOUCH)
    c.interrupt()  # the client's Python handler only reports it
    # The client may still die of the signal after reporting (a race with Python's own handler,
    # not the module's behaviour): the reported result is what counts.
    assert c.wait(60) in (0, -signal.SIGINT)
    [result] = [e for e in c.events() if e["event"] == "result"]
    assert result["rc"] == PAM_AUTHINFO_UNAVAIL and result["seconds"] < 5
    time.sleep(0.5)
    started = time.monotonic()
    c = Client(pam, "kioskauth", "sarah", "authenticate")
    c.expect(TOUCH)
    scan(sensor, "sarah-finger")
    assert c.results()[0]["rc"] == PAM_SUCCESS
    assert time.monotonic() - started < 10
    assert any(e.get("detail") == "io.kioskauth.ScanCancelled" for e in audit(d, "finger.verify"))


def test_the_module_timeout_cancels_the_scan(make_daemon, pam):
    d, sensor = start(make_daemon, "virtual_device")
    add_person(d, "sarah")
    enroll(d, sensor, "sarah", "sarah-finger")
    pam.kioskauth("kioskauth", d.socket, "mode=verify timeout=1")
    p = Pamtester(pam, "kioskauth", "sarah", "authenticate")
    p.expect(TOUCH)
    assert p.result() == PAM_AUTHINFO_UNAVAIL
    assert p.elapsed < 5


# Shipped stacks -----------------------------------------------------------------------------------


def debian_common(profile: Path, socket_path: str) -> str:
    """common-auth and common-account as pam-auth-update composes them from this profile and
    Debian's unix profile: Primary lines in priority order, `end` replaced by the jump past
    pam_deny, Additional lines after pam_permit."""
    def fields(text):
        result, key = {}, None
        for line in text.splitlines():
            if line.startswith(("\t", " ")) and key:
                result[key] = result.get(key, "") + line.strip() + "\n"
            elif ":" in line:
                key, value = line.split(":", 1)
                result[key] = value.strip() + ("\n" if value.strip() else "")
        return result
    ours = fields(profile.read_text())
    ours_auth = ours["Auth"].strip().replace("pam_kioskauth.so", f"{MODULE} socket={socket_path}")
    ours_account = ours["Account"].strip().replace("pam_kioskauth.so", f"{MODULE} socket={socket_path}")
    assert ours["Auth-Type"].strip() == "Primary" and ours["Account-Type"].strip() == "Additional"
    assert int(ours["Priority"]) > 256  # before pam_unix
    primaries = [ours_auth, "[success=end default=ignore] pam_unix.so nullok try_first_pass"]
    auth = [f"auth {line.replace('success=end', f'success={len(primaries) - i}')}" for i, line in enumerate(primaries)]
    auth += ["auth requisite pam_deny.so", "auth required pam_permit.so"]
    account = ["account [success=1 new_authtok_reqd=done default=ignore] pam_unix.so",
               "account requisite pam_deny.so", "account required pam_permit.so", f"account {ours_account}"]
    return "\n".join(auth + account) + "\n"


def test_every_shipped_stack_refuses_when_the_daemon_is_down(make_daemon, pam, tmp_path, unix_user):
    d, _ = start(make_daemon)
    # Desktop-login stacks need a Unix account too: the person is bound to the account's uid.
    account, uid = unix_user()
    add_person(d, account, uid=uid)
    services = {name: pam.shipped(name, path, d.socket) for name, path in SHIPPED_STACKS.items()}
    services["login"] = pam.add("login", debian_common(REPO / "pam" / "pam-configs" / "kioskauth", d.socket))
    # With the daemon up, each stack lets the account's person in with the passcode (sudo: as
    # sudo runs, the invoking user's real uid, effective uid root).
    for service in services:
        c = Client(pam, service, account, "authenticate", "acct_mgmt", run_as=["setpriv", f"--ruid={uid}", "--"])
        c.send(PASSCODE)
        assert [r["rc"] for r in c.results()] == [PAM_SUCCESS, PAM_SUCCESS], (service, c.transcript)
    d.stop()
    # Down: nobody gets in, whoever they claim to be (root's Unix password is locked here).
    for service in services:
        for user in (account, "root", None, "sarah"):
            c = Client(pam, service, user, "authenticate", "acct_mgmt")
            for answer in ("sarah", PASSCODE, "wrong-password"):
                c.send(answer)
            results = c.results()
            assert results[-1]["rc"] != PAM_SUCCESS, (service, user, c.transcript)
            assert results[0]["seconds"] < 5, (service, user)
        assert run_pamtester(pam, service, "root", "authenticate").result() != PAM_SUCCESS


def test_shipped_stacks_name_real_modules_and_each_ends_in_pam_deny(module):
    for path in SHIPPED_STACKS.values():
        last = {}
        for line in path.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            kind, _control, name, *_options = re.sub(r"\[[^]]*\]", "CONTROL", line).split()
            assert kind in ("auth", "account", "password", "session"), line
            assert name == "pam_kioskauth.so" or (security_dir() / name).exists(), line
            last[kind] = name
        assert "auth" in last and "account" in last, path
        assert set(last.values()) == {"pam_deny.so"}, (path, last)
