"""End to end: the audit chain and the store's security-relevant rows cannot be broken or altered
unnoticed (issue #11 items 3, 8 and 13)."""

import json
import sqlite3
import time

from kioskauth_testing import FAST_HASH_CONFIG

from test_core_e2e import add, set_passcode

NUL = "\u0000"


def audit_events(daemon):
    return json.loads(daemon.ctl("audit", "--json", "--limit", "10000").stdout)["events"]


def test_nul_bearing_values_from_an_unprivileged_caller_leave_the_chain_intact(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    context = {"service": f"login{NUL}evil", "tty": f"tty1{NUL}x", "remoteHost": f"h{NUL}ost", "ruid": 0}
    evil = f"sa{NUL}rah"
    calls = [
        ("VerifyPasscode", {"name": "sarah", "passcode": f"48{NUL}2913", "context": context}),
        ("VerifyPasscode", {"name": evil, "passcode": "482913", "context": context}),
        ("AddPerson", {"name": evil, "displayName": f"Ev{NUL}il", "roles": [f"care{NUL}giver"]}),
        ("GetPerson", {"name": evil}),
        ("RemovePerson", {"name": evil}),
        ("ResetLockout", {"name": evil}),
        ("SetPasscode", {"name": evil, "passcode": f"1{NUL}2345678"}),
        ("IssueActivationCode", {"name": evil}),
        ("RevokeActivationCode", {"name": evil}),
        ("CheckActivationCode", {"code": f"ABCD{NUL}EFGH", "context": context}),
        ("CompleteActivation", {"code": f"ABCD{NUL}EFGH", "passcode": f"9{NUL}99999", "context": context}),
        ("ExportPerson", {"name": evil}),
        ("CheckAccount", {"name": evil, "context": context}),
        ("CheckOnlineLogin", {"context": context}),
        ("LoginWithPassword", {"username": evil, "password": f"p{NUL}w", "context": context}),
        ("EnrollFinger", {"name": evil, "finger": f"right{NUL}index"}),
        ("RemoveFinger", {"name": evil, "finger": f"right{NUL}index"}),
        ("VerifyFinger", {"name": evil, "context": context}),
        ("SetBiometricOffer", {"name": evil, "enabled": False}),
        ("OpenSession", {"name": evil, "context": context}),
        ("GetAudit", {}),
        ("VerifyAudit", {"head": f"1{NUL}:00"}),
    ]
    for method, parameters in calls:
        reply = daemon.call("io.kioskauth." + method, parameters, user="nobody")
        assert "error" in reply, (method, reply)
    # As root too: a privileged caller's refusals are audited one by one. Every NUL-bearing call
    # string is refused at input (InvalidInput naming the field) before anything is audited with
    # it; the store's own byte-length binding (a NUL round-trips exactly) is covered by
    # AuditChainTests.nulBearingFields_roundTripExactly_andTheChainStaysIntact.
    for method, parameters in calls:
        reply = daemon.call("io.kioskauth." + method, parameters)
        if method != "GetAudit":
            assert reply.get("error") == "io.kioskauth.InvalidInput", (method, reply)
    r = daemon.ctl("audit", "verify")
    assert r.returncode == 0, r.stdout
    assert "audit chain intact" in r.stdout
    daemon.restart()
    assert "does not verify" not in daemon.log_text()
    assert daemon.ctl("audit", "verify").returncode == 0


def test_truncated_audit_trail_is_refused_at_start_and_only_an_audited_acceptance_serves_it(daemon):
    for name in ("sarah", "omar", "lena", "ivo"):
        add(daemon, name)
    events = audit_events(daemon)
    head = events[-1]
    daemon.stop()
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("DELETE FROM audit WHERE seq > (SELECT MAX(seq) - 3 FROM audit)")
        (seq, mac) = conn.execute("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        # The recorded head inside the database is rewritten too, as a careful attacker would.
        conn.execute("UPDATE meta SET value = ? WHERE key = 'audit_head'", (str(seq).encode() + b"\0" + mac,))
    # The anchor beside the database still records the old head: the start is refused.
    before = daemon.log_text()
    daemon.start(expect_ready=False)
    assert daemon.wait_exit() == 78
    assert "behind its audit head anchor" in daemon.log_text()[len(before):]
    # Deleting the anchor as well (and its meta row) is refused too.
    (daemon.state / "audit-head").rename(daemon.state / "audit-head.saved")
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("DELETE FROM meta WHERE key = 'audit_anchor'")
    before = daemon.log_text()
    daemon.start(expect_ready=False)
    assert daemon.wait_exit() == 78
    assert "anchor" in daemon.log_text()[len(before):] and "missing" in daemon.log_text()[len(before):]
    (daemon.state / "audit-head.saved").rename(daemon.state / "audit-head")
    # An admin may accept it; that is audited with what was lost, and the chain goes on.
    daemon.extra_args = ["--accept-store-rollback"]
    daemon.start()
    daemon.extra_args = []
    accepted = [e for e in audit_events(daemon) if e["action"] == "store.rollback.accepted"]
    assert len(accepted) == 1 and f"the chain ends at entry {seq}" in accepted[0]["detail"]
    assert int(accepted[0]["detail"].split("anchor records entry ")[1].split(",")[0]) > head["sequence"] - 1
    for name in ("zoe", "yan", "xia", "wim", "val"):
        add(daemon, name)
    # Against a trusted head from before (the journal's audit_seq:audit_head) it still fails.
    trusted = f"{head['sequence']}:{head['mac']}"
    assert daemon.ctl("audit", "verify", "--head", trusted).returncode == 1


def test_verify_against_a_trusted_head(daemon):
    add(daemon, "sarah")
    events = audit_events(daemon)
    older = events[-2]
    assert daemon.ctl("audit", "verify", "--head", f"{older['sequence']}:{older['mac']}").returncode == 0
    wrong = daemon.ctl("audit", "verify", "--head", f"{older['sequence']}:{events[-1]['mac']}")
    assert wrong.returncode == 1 and "another MAC" in wrong.stdout
    ahead = daemon.ctl("audit", "verify", "--head", f"{events[-1]['sequence'] + 5}:{events[-1]['mac']}")
    assert ahead.returncode == 1 and "truncated" in ahead.stdout
    r = daemon.call("io.kioskauth.VerifyAudit", {"head": "seven"})
    assert r["error"] == "io.kioskauth.InvalidInput" and r["parameters"]["field"] == "head"


def test_a_uid_rebound_in_the_database_is_refused_as_store_integrity_and_audited(daemon):
    add(daemon, "sarah", "--uid", "4242")
    add(daemon, "omar")
    assert set_passcode(daemon, "omar", "593024").returncode == 0
    # nobody (65534) is bound to nobody; binding Omar to it behind the daemon's back must not
    # let nobody authenticate as Omar.
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("UPDATE people SET uid = 65534 WHERE name = 'omar'")
    r = daemon.call("io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "593024"}, user="nobody")
    assert r.get("error") == "io.kioskauth.StoreIntegrity", r
    assert "parameters" not in r or "matched" not in r.get("parameters", {})
    events = audit_events(daemon)
    assert any(e["action"] == "store.integrity" for e in events), events[-3:]


def test_a_sealed_passcode_rewritten_as_text_is_store_integrity_not_no_passcode(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    with sqlite3.connect(daemon.state / "kioskauth.sqlite") as conn:
        conn.execute("UPDATE secrets SET sealed = CAST(sealed AS TEXT)")
        assert conn.execute("SELECT typeof(sealed) FROM secrets").fetchone() == ("text",)
    r = daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"})
    assert r.get("error") == "io.kioskauth.StoreIntegrity", r
    assert any(e["action"] == "store.integrity" and e.get("person") == "sarah" for e in audit_events(daemon))


def test_an_entry_edited_before_the_checkpoint_is_found_by_audit_verify_and_the_scheduled_check(make_daemon):
    """Start-up checks the chain only from the sealed checkpoint (the anchored head) on, so it
    starts; `audit verify` and the scheduled full check still find the edit, and the scheduled
    check reports it as start-up would (one line naming the database, exit status 78)."""
    daemon = make_daemon(config=FAST_HASH_CONFIG + "AuditVerifyInterval=3600\n").start()
    for name in ("sarah", "omar", "lena"):
        add(daemon, name)
    daemon.stop()
    database = daemon.state / "kioskauth.sqlite"
    with sqlite3.connect(database) as conn:
        (anchored,) = conn.execute("SELECT MAX(seq) FROM audit").fetchone()
        conn.execute("UPDATE audit SET detail = 'nothing to see' WHERE seq = 2")
    assert anchored > 2
    daemon.start()
    r = daemon.ctl("audit", "verify")
    assert r.returncode == 1 and "entry 2 does not match its MAC" in r.stdout, r.stdout
    daemon.stop()
    # The scheduled check, every second here: the daemon stops with the start-up refusal's line.
    daemon.config_path.write_text(FAST_HASH_CONFIG + "AuditVerifyInterval=1\n")
    before = daemon.log_text()
    daemon.start()
    assert daemon.wait_exit(timeout=30) == 78
    said = daemon.log_text()[len(before):]
    assert f"{database}: audit entry 2 does not match its MAC" in said, said


def test_the_scheduled_check_passes_an_intact_chain_and_keeps_serving(make_daemon):
    daemon = make_daemon(config=FAST_HASH_CONFIG + "AuditVerifyInterval=0.5\n").start()
    for name in ("sarah", "omar"):
        add(daemon, name)
    deadline = time.monotonic() + 20
    while "audit chain verified" not in daemon.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "audit chain verified" in daemon.log_text()
    assert daemon.proc.poll() is None
    assert daemon.ctl("status").returncode == 0


def test_a_tampered_checkpoint_is_refused_at_start(daemon):
    """The checkpoint is sealed: moving it (another entry's sequence and MAC under the old seal)
    or editing its seal is refused before serving, so start-up cannot be talked into skipping
    the entries after the real one."""
    for name in ("sarah", "omar"):
        add(daemon, name)
    daemon.stop()
    anchor = daemon.state / "audit-head"
    original = anchor.read_bytes()
    # Claim a later checkpoint than the real one, keeping the seal: it no longer checks out.
    def forge(edit):
        slots = []
        for index in range(2):
            fields = original[index * 256:(index + 1) * 256].decode().split("\n")[0].split(" ")
            edit(fields)
            slots.append((" ".join(fields) + "\n").ljust(256).encode())
        return b"".join(slots)

    def later(fields):
        fields[2] = str(int(fields[2]) + 2)

    def reseal(fields):
        fields[4] = fields[4][:-1] + ("0" if fields[4][-1] != "0" else "1")

    for forged in (forge(later), forge(reseal)):
        anchor.write_bytes(forged)
        before = daemon.log_text()
        daemon.start(expect_ready=False)
        assert daemon.wait_exit() == 78
        assert "does not check out" in daemon.log_text()[len(before):]
    anchor.write_bytes(original)
    daemon.start()
    assert daemon.ctl("audit", "verify").returncode == 0


def test_a_person_row_edited_behind_the_store_is_found_by_the_sweep_once_serving(daemon):
    """The check before serving reads nothing that grows with the people (start-up stays flat);
    the sweep that runs as soon as READY=1 is sent reads every row, and stops the daemon as the
    start-up refusal would: one line naming the database and the row, exit status 78."""
    for name in ("sarah", "omar"):
        add(daemon, name)
    assert set_passcode(daemon, "omar", "593024").returncode == 0
    daemon.restart()
    deadline = time.monotonic() + 30
    while "store rows checked" not in daemon.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "store rows checked" in daemon.log_text()
    assert daemon.proc.poll() is None
    daemon.stop()
    database = daemon.state / "kioskauth.sqlite"
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE people SET passcode_failures = 0, roles = 'admin' WHERE name = 'omar'")
    before = daemon.log_text()
    daemon.start()  # the fixed check passes: READY=1
    assert daemon.wait_exit(timeout=30) == 78
    said = daemon.log_text()[len(before):]
    lines = [line for line in said.splitlines() if line.startswith("kioskauthd: ")]
    assert len(lines) == 1 and f"{database}: " in lines[0] and "people row" in lines[0], said


def test_a_sealed_secret_swapped_between_people_is_found_by_the_sweep(daemon):
    """Secrets are no longer all opened before serving: the sweep once serving opens every one
    (and a call opens the one it uses: see the test above on a passcode rewritten as text)."""
    for name in ("sarah", "omar"):
        add(daemon, name)
        assert set_passcode(daemon, name, "593024").returncode == 0
    daemon.stop()
    database = daemon.state / "kioskauth.sqlite"
    with sqlite3.connect(database) as conn:
        (sarah,) = conn.execute("SELECT s.sealed FROM secrets s JOIN people p ON p.id = s.person_id "
                                "WHERE p.name = 'sarah'").fetchone()
        conn.execute("UPDATE secrets SET sealed = ? WHERE person_id = (SELECT id FROM people WHERE name = 'omar')",
                     (sarah,))
    before = daemon.log_text()
    daemon.start()
    assert daemon.wait_exit(timeout=30) == 78
    said = daemon.log_text()[len(before):]
    assert "does not open" in said, said
