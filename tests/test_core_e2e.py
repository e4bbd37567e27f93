"""End to end: the real kioskauthd driven by kioskauthctl and by the `varlink` Python package."""

import json
import re
import sqlite3
import subprocess
import time

import pytest
import varlink

from kioskauth_testing import (FAST_HASH_CONFIG, KIOSKAUTHCTL, REPO, SLOW_HASH_CONFIG, Daemon, kill_mid_check,
                               read_message, start_check, still_checking)


def add(daemon, name="sarah", *extra):
    r = daemon.ctl("user", "add", name, "--display-name", name.title(), *extra)
    assert r.returncode == 0, r.stderr
    return r


def set_passcode(daemon, name, code):
    return daemon.ctl("passcode", "set", name, input=f"{code}\n{code}\n")


def verify(daemon, name, code, **kwargs):
    return daemon.ctl("passcode", "verify", name, input=f"{code}\n", **kwargs)


def test_add_set_verify_right_and_wrong_then_remove(daemon):
    add(daemon, "sarah", "--role", "caregiver", "--role", "family", "--uid", "4242")
    listed = json.loads(daemon.ctl("user", "list", "--json").stdout)["people"]
    assert [(p["name"], p["primaryRole"], p["roles"], p["uid"], p["hasPasscode"]) for p in listed] == [
        ("sarah", "caregiver", ["caregiver", "family"], 4242, False)
    ]

    r = set_passcode(daemon, "sarah", "482913")
    assert r.returncode == 0, r.stderr
    assert verify(daemon, "sarah", "482913").returncode == 0

    wrong = verify(daemon, "sarah", "000001")
    assert wrong.returncode == 1
    assert wrong.stderr.strip() == "kioskauthctl: wrong passcode (1 failed attempt in a row)"

    r = daemon.ctl("user", "remove", "sarah")
    assert r.returncode == 0, r.stderr
    gone = daemon.ctl("user", "show", "sarah")
    assert gone.returncode == 1 and "no person named sarah" in gone.stderr
    # The audit keeps the removal, and the chain verifies.
    events = json.loads(daemon.ctl("audit", "--json").stdout)["events"]
    assert [e["action"] for e in events if e.get("person") == "sarah"][-1] == "person.remove"
    assert daemon.ctl("audit", "verify").returncode == 0


def test_removal_erases_secrets_from_the_database_file(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    db = daemon.state / "kioskauth.sqlite"
    with sqlite3.connect(db) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM secrets").fetchone()
    assert daemon.ctl("user", "remove", "sarah").returncode == 0
    daemon.stop()
    raw = db.read_bytes() + (db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists() else b"")
    # secure_delete zeroes freed pages and the WAL was truncated: the ciphertext is nowhere.
    assert sealed[8:40] not in raw
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM secrets").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM people").fetchone() == (0,)


def test_weak_codes_and_mismatch_are_refused_with_the_reason(daemon):
    add(daemon, "sarah")
    cases = {
        "123456": "sequence",
        "000000": "",
        "12345": "at least 6",
        "abcdef": "",
        "121212": "",
    }
    for code, words in cases.items():
        r = set_passcode(daemon, "sarah", code)
        assert r.returncode == 1, code
        assert words in r.stderr
    r = daemon.ctl("passcode", "set", "sarah", input="482913\n482914\n")
    assert r.returncode == 1
    reply = daemon.call("io.kioskauth.SetPasscode", {"name": "sarah", "passcode": "482913", "confirmation": "482914"})
    assert reply["error"] == "io.kioskauth.WeakPasscode" and reply["parameters"]["reason"] == "mismatch"
    shown = json.loads(daemon.ctl("user", "show", "sarah", "--json").stdout)["person"]
    assert shown["hasPasscode"] is False


def test_lockout_schedule_survives_a_daemon_restart(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    for _ in range(2):
        assert verify(daemon, "sarah", "111112").returncode == 1
    third = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "111113"})
    assert third["error"] == "io.kioskauth.WrongPasscode"
    assert third["parameters"]["failures"] == 3 and 59 <= third["parameters"]["retryAfterSeconds"] <= 60

    daemon.restart()

    # The right code is refused during the delay, without counting as a failure.
    locked = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
    assert locked["error"] == "io.kioskauth.PasscodeLocked"
    assert locked["parameters"]["hardLocked"] is False and locked["parameters"]["retryAfterSeconds"] > 0
    person = daemon.call("io.kioskauth.GetPerson", {"name": "sarah"})["parameters"]["person"]
    assert person["passcodeFailures"] == 3 and person["passcodeLockedUntil"]

    assert daemon.ctl("lockout", "reset", "sarah").returncode == 0
    assert verify(daemon, "sarah", "482913").returncode == 0


def test_a_check_cut_short_by_a_kill_stays_a_failure_and_the_next_start_audits_it(make_daemon):
    """An attempt is counted as a failure before its hash is checked, so killing the daemon
    mid-check gives no free try; the next start records the interrupted check in the audit trail
    (and, in a fleet, reports it to the directory: tests/test_fleet_e2e.py)."""
    d = make_daemon(config=SLOW_HASH_CONFIG).start()
    add(d, "sarah")
    assert set_passcode(d, "sarah", "482913").returncode == 0
    kill_mid_check(d, "sarah", "482913")
    d.start()
    person = d.call("io.kioskauth.GetPerson", {"name": "sarah"})["parameters"]["person"]
    assert person["passcodeFailures"] == 1, person
    events = json.loads(d.ctl("audit", "--json", "--limit", "50").stdout)["events"]
    interrupted = [e for e in events if e["action"] == "passcode.verify" and e.get("person") == "sarah"]
    assert [(e["result"], e.get("detail")) for e in interrupted] == [
        ("failure", "1 attempt interrupted before the check ended, counted as failed; failures=1")], interrupted
    d.restart()  # recorded once, not at every start
    events = json.loads(d.ctl("audit", "--json", "--limit", "50").stdout)["events"]
    assert len([e for e in events if e["action"] == "passcode.verify"]) == 1
    assert verify(d, "sarah", "482913").returncode == 0
    assert d.call("io.kioskauth.GetPerson", {"name": "sarah"})["parameters"]["person"]["passcodeFailures"] == 0
    assert d.ctl("audit", "verify").returncode == 0


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), if it has them."""
    try:
        return re.search(r"\[(\w+)\]", open("/sys/kernel/mm/transparent_hugepage/enabled").read()).group(1)
    except (OSError, AttributeError):
        return None


@pytest.mark.skipif(thp_mode() != "madvise", reason="needs transparent huge pages in madvise mode")
@pytest.mark.parametrize("huge", [True, False])
def test_argon2id_memory_is_on_huge_pages_unless_configured_off(make_daemon, huge):
    """[Store] PasscodeHashHugePages: a passcode check's Argon2id memory (64 MiB) is on
    transparent huge pages while it runs, or, set to no, none of the daemon's memory is."""
    d = make_daemon(config=SLOW_HASH_CONFIG + f"PasscodeHashHugePages={'yes' if huge else 'no'}\n").start()
    add(d, "sarah")
    assert set_passcode(d, "sarah", "482913").returncode == 0
    with start_check(d, "sarah", "111112") as check:
        peak = 0
        while still_checking(check):
            rollup = open(f"/proc/{d.proc.pid}/smaps_rollup").read()
            peak = max(peak, int(re.search(r"AnonHugePages:\s+(\d+)", rollup).group(1)))
            time.sleep(0.02)
        assert read_message(check)["error"] == "io.kioskauth.WrongPasscode"
    if huge:
        assert peak >= 32 * 1024, f"{peak} KiB on huge pages"
    else:
        assert peak == 0, f"{peak} KiB on huge pages"


def test_tenth_failure_hard_locks_until_admin_reset(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Passcode]\nLockoutDelaysSec=0\n").start()
    add(d, "sarah")
    assert set_passcode(d, "sarah", "482913").returncode == 0
    for attempt in range(1, 10):
        r = d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "111112"})
        assert r["error"] == "io.kioskauth.WrongPasscode" and r["parameters"]["failures"] == attempt
    tenth = d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "111112"})
    assert tenth["error"] == "io.kioskauth.PasscodeLocked" and tenth["parameters"]["hardLocked"] is True
    d.restart()
    right = verify(d, "sarah", "482913")
    assert right.returncode == 1 and "an admin must reset it" in right.stderr
    assert d.ctl("lockout", "reset", "sarah").returncode == 0
    assert verify(d, "sarah", "482913").returncode == 0


def test_default_hash_parameters_are_recorded_per_row(make_daemon):
    d = make_daemon(config="").start()
    add(d, "sarah")
    assert set_passcode(d, "sarah", "482913").returncode == 0
    assert verify(d, "sarah", "482913").returncode == 0
    d.stop()
    # Raising the parameters later must not invalidate existing verifiers.
    d.config_path.write_text("[Store]\nPasscodeHashMemoryKiB=2048\nPasscodeHashIterations=1\n")
    d.start()
    assert verify(d, "sarah", "482913").returncode == 0


def test_varlink_python_client_introspects_calls_and_gets_named_errors(daemon):
    with varlink.Client(address=f"unix:{daemon.socket}") as client:
        with client.open("org.varlink.service") as service:
            info = service.GetInfo()
            assert "io.kioskauth" in info["interfaces"]
            description = service.GetInterfaceDescription("io.kioskauth")["description"]
            assert description.startswith("# The kioskauth daemon's socket API")
        with client.open("io.kioskauth", namespaced=True) as api:
            person = api.AddPerson(name="omar", displayName="Omar", roles=["coordinator"]).person
            assert person.primaryRole == "coordinator" and person.state == "pending_activation"
            with pytest.raises(varlink.VarlinkError) as raised:
                api.GetPerson(name="nobody-here")
            assert raised.value.error() == "io.kioskauth.NoSuchPerson"
            assert raised.value.parameters()["name"] == "nobody-here"


def test_interface_file_in_repo_is_what_the_daemon_serves(daemon):
    from kioskauth_testing import REPO

    served = daemon.call("org.varlink.service.GetInterfaceDescription", {"interface": "io.kioskauth"})
    text = (REPO / "Sources" / "KioskAuthProtocol" / "io.kioskauth.varlink").read_text()
    assert served["parameters"]["description"] == text.rstrip("\n")
    # And the varlink package parses it.
    varlink.Interface(served["parameters"]["description"])


def test_store_refuses_a_different_key_and_changes_nothing(make_daemon):
    d = make_daemon(credential_key=b"k" * 32).start()
    add(d, "sarah")
    d.stop()
    db = d.state / "kioskauth.sqlite"
    before = db.read_bytes()
    wrong = Daemon(credential_key=b"x" * 32)
    wrong.state = d.state
    wrong.start(expect_ready=False)
    assert wrong.wait_exit() == 78
    assert "the store key does not open this store" in wrong.log_text()
    assert db.read_bytes() == before
    wrong.close()


def test_missing_credential_without_development_flag_is_a_clear_startup_error(make_daemon):
    d = make_daemon(credential_key=b"k" * 32)
    (d.credentials / "kioskauth.store-key").unlink()
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "no credential kioskauth.store-key" in d.log_text()


@pytest.mark.parametrize("section, key", [
    ("Access", "RefusalSummaryIntervalSec"), ("Access", "TicketLifetimeSec"), ("Socket", "IdleTimeoutSec"),
    ("Socket", "WriteTimeoutSec"), ("Store", "AuditVerifyInterval"), ("Fingerprint", "ScanTimeoutSec"),
    ("Passcode", "LockoutDelaysSec"), ("Activation", "CodeLifetimeSec"), ("Daemon", "IdleReleaseSec"),
])
def test_seconds_beyond_a_year_are_a_named_configuration_error_not_a_later_crash(make_daemon, section, key):
    # 1e16 s passed the parser and trapped later (milliseconds into Int64), at the first refused
    # call, unlock or scan. Refused at start now, naming the key and the range.
    d = make_daemon(config=FAST_HASH_CONFIG + f"\n[{section}]\n{key}=1e16\n")
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert f"{key}" in d.log_text() and "expected a number of seconds in 0...31622400 (a year)" in d.log_text(), \
        d.log_text()


def test_a_store_from_a_future_schema_is_refused(make_daemon):
    d = make_daemon().start()
    d.stop()
    with sqlite3.connect(d.state / "kioskauth.sqlite") as conn:
        conn.execute("PRAGMA user_version=99")
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "schema version 99" in d.log_text()


def test_the_daemons_bad_command_lines_exit_64_and_touch_nothing(make_daemon):
    d = make_daemon()
    elsewhere = d.root / "elsewhere"
    cases = [
        (["--bogus"], "unknown option '--bogus'"),
        (["--log-level", "loud"], "unknown log level loud (one of: trace, debug, info, notice, warning, error, critical)"),
        (["--log-level"], "missing value for '--log-level <level>'"),
        (["--socket="], "empty value for '--socket'"),
        (["--config", str(d.config_path)], "option '--config' given more than once"),
        (["stray"], "unexpected argument 'stray'"),
        (["--socket", str(elsewhere / "a"), "--socket", str(elsewhere / "b")], "option '--socket' given more than once"),
        (["--accept-store-rollback=yes"], "option '--accept-store-rollback' takes no value"),
        (["--help=please"], "option '--help' takes no value"),
    ]
    for extra, fault in cases:
        r = subprocess.run([*d.command(), *extra], capture_output=True, text=True, env=d.environment(), timeout=20)
        assert r.returncode == 64, (extra, r)
        assert r.stdout == "" and r.stderr == f"kioskauthd: {fault}\nUsage: kioskauthd [options]; see kioskauthd --help\n", (
            extra, r.stderr)
    # Refused before anything was created.
    assert not d.state.exists() and not d.runtime.exists() and not elsewhere.exists()
    version = re.search(r'public static let string = "([^"]+)"',
                        (REPO / "Sources/KioskAuthProtocol/Version.swift").read_text()).group(1)
    for asked, expected in ((["--version"], f"{version}\n"), (["-h"], None), (["--help"], None)):
        r = subprocess.run([*d.command(), *asked], capture_output=True, text=True, env=d.environment(), timeout=20)
        assert r.returncode == 0 and r.stderr == "", r
        if expected:
            assert r.stdout == expected
        else:
            assert r.stdout.startswith("kioskauthd: ") and "--accept-store-rollback" in r.stdout, r.stdout
    # The joined form works as the separate one does: the level takes effect.
    d.extra_args = ["--log-level=debug"]
    d.start()
    assert d.stop() == 0
    assert re.search(r"^\S+ debug kioskauthd: ", d.log_text(), re.MULTILINE), d.log_text()[-2000:]


def test_swapped_passcode_ciphertexts_are_refused_and_audited(daemon):
    add(daemon, "sarah")
    add(daemon, "omar")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    assert set_passcode(daemon, "omar", "593024").returncode == 0
    db = daemon.state / "kioskauth.sqlite"
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT p.name, s.sealed FROM secrets s JOIN people p ON p.id = s.person_id"))
        conn.execute("UPDATE secrets SET sealed = ? WHERE person_id = (SELECT id FROM people WHERE name = 'sarah')", (rows["omar"],))
    # Omar's passcode in Sarah's row opens for nobody.
    r = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "593024"})
    assert r["error"] == "io.kioskauth.StoreIntegrity"
    events = json.loads(daemon.ctl("audit", "--json").stdout)["events"]
    assert any(e["action"] == "store.integrity" and e.get("person") == "sarah" for e in events)


def test_flipped_ciphertext_byte_is_refused(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        (sealed,) = conn.execute("SELECT sealed FROM secrets").fetchone()
        flipped = bytearray(sealed)
        flipped[20] ^= 0x01
        conn.execute("UPDATE secrets SET sealed = ?", (bytes(flipped),))
    r = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
    assert r["error"] == "io.kioskauth.StoreIntegrity"


def test_edited_audit_entry_breaks_the_chain(daemon):
    add(daemon, "sarah")
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("UPDATE audit SET result = 'failure' WHERE action = 'person.add'")
    r = daemon.ctl("audit", "verify")
    assert r.returncode == 1 and "AUDIT CHAIN BROKEN at event 2" in r.stdout


def test_truncated_audit_trail_is_detected(daemon):
    add(daemon, "sarah")
    add(daemon, "omar")
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("DELETE FROM audit WHERE seq = (SELECT MAX(seq) FROM audit)")
    r = daemon.ctl("audit", "verify")
    assert r.returncode == 1 and "deleted" in r.stdout


def test_killing_the_daemon_mid_write_leaves_a_consistent_store(make_daemon):
    d = make_daemon().start()
    ctl = str(KIOSKAUTHCTL)
    # Eight writers adding people as fast as they can; SIGKILL lands in the middle of commits.
    writers = [
        subprocess.Popen(["bash", "-c", f"for j in $(seq 1 40); do '{ctl}' user add w{i}n$j --socket '{d.socket}' >/dev/null 2>&1; done"])
        for i in range(8)
    ]
    time.sleep(1.5)
    d.kill()
    for w in writers:
        w.wait()
    db = d.state / "kioskauth.sqlite"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    d.start()
    people = len(json.loads(d.ctl("user", "list", "--json").stdout)["people"])
    assert json.loads(d.ctl("status", "--json").stdout)["people"] == people > 0
    assert d.ctl("audit", "verify").returncode == 0
    added = [e for e in json.loads(d.ctl("audit", "--json", "--limit", "10000").stdout)["events"]
             if e["action"] == "person.add" and e["result"] == "success"]
    # The person, their activation code and the audit entry commit in one transaction.
    assert len(added) == people


def test_usage_errors_exit_2_and_failures_exit_1(daemon):
    assert daemon.ctl("user", "add").returncode == 2
    assert daemon.ctl("user", "add", "x", "--role", "janitor").returncode == 2
    r = daemon.ctl("user", "show", "ghost")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    r = subprocess.run([str(KIOSKAUTHCTL), "status", "--socket", "/nonexistent/sock"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "cannot reach kioskauthd" in r.stderr


def test_log_lines_carry_syslog_priorities_when_stderr_is_the_journal(make_daemon):
    """Under systemd, JOURNAL_STREAM names stderr's device:inode: each line then starts with its
    priority (<6> info, <4> warning, ...) for journald, without a timestamp of its own. Anywhere
    else (JOURNAL_STREAM absent, or naming another file) lines keep a timestamp and a level word."""
    d = make_daemon(config=FAST_HASH_CONFIG)
    d.log_path.touch()
    st = d.log_path.stat()
    d.extra_env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    d.start()
    add(d, "sarah")
    assert set_passcode(d, "sarah", "482913").returncode == 0
    assert verify(d, "sarah", "000001").returncode == 1
    d.close()
    lines = [line for line in d.log_text().splitlines() if line]
    assert lines and all(line[:3] in ("<2>", "<3>", "<4>", "<5>", "<6>", "<7>") for line in lines), lines
    assert any(line.startswith("<6>audit ") and "action=passcode.verify" in line for line in lines), lines
    assert not any("info kioskauthd:" in line for line in lines)

    other = make_daemon(config=FAST_HASH_CONFIG)
    other.extra_env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"  # not this daemon's stderr
    other.start()
    other.close()
    plain = [line for line in other.log_text().splitlines() if line]
    assert plain and not any(line.startswith("<") for line in plain)
    assert any(" info kioskauthd: " in line for line in plain), plain


def test_an_admin_suspends_and_resumes_a_person_and_nobody_else_can(daemon):
    add(daemon, "omar")
    set_passcode(daemon, "omar", "482913")
    # Neither an unprivileged user nor the authenticator group may suspend anyone, and an
    # unprivileged caller learns nothing about whether the name exists.
    for user, groups in (("nobody", None), ("nobody", ["kioskauth"])):
        for name in ("omar", "nobody-here"):
            reply = daemon.call("io.kioskauth.SuspendPerson", {"name": name}, user=user, groups=groups)
            assert reply.get("error") == "io.kioskauth.PermissionDenied", reply
    assert verify(daemon, "omar", "482913").returncode == 0

    r = daemon.ctl("user", "suspend", "omar", "--reason", "left the ward")
    assert r.returncode == 0 and r.stdout.strip() == "omar is suspended"
    reply = daemon.call("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "482913"})
    assert reply["error"] == "io.kioskauth.PersonNotActive" and reply["parameters"]["state"] == "suspended", reply
    shown = json.loads(daemon.ctl("user", "show", "omar", "--json").stdout)["person"]
    assert shown["state"] == "suspended"
    # Suspending keeps the secrets: resuming brings the same passcode back.
    r = daemon.ctl("user", "resume", "omar")
    assert r.returncode == 0 and r.stdout.strip() == "omar is active again"
    assert verify(daemon, "omar", "482913").returncode == 0
    # Resuming someone who is not suspended is a clear input error.
    r = daemon.ctl("user", "resume", "omar")
    assert r.returncode == 1 and "not suspended" in r.stderr
    events = [(e["action"], e["result"], e.get("detail")) for e in daemon.call("io.kioskauth.GetAudit", {})["parameters"]["events"]
              if e["action"] in ("person.suspend", "person.resume")]
    assert ("person.suspend", "success", "left the ward") in events
    assert ("person.resume", "success", None) in events
    assert sum(1 for e in events if e[1] == "refused") >= 2
    # The row MAC follows every state change: the chain and the rows are intact.
    assert daemon.ctl("audit", "verify").returncode == 0
