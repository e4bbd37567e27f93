"""End to end: the store's faults at start-up, each refused with one line and exit 78 (EX_CONFIG)
or recovered from explicitly (issue #13 items 2, 3 and 5; issue #11 item 13). The outcomes are
tabulated in docs/reliability.md."""

import json
import os
import sqlite3
import subprocess

from kioskauth_testing import Daemon
from test_core_e2e import add, set_passcode, verify
from test_onboarding import Terminal
from test_onboarding import add as add_with_code

EX_CONFIG = 78
DB = "kioskauth.sqlite"


def audit_events(daemon):
    return json.loads(daemon.ctl("audit", "--json", "--limit", "10000").stdout)["events"]


def refused(daemon) -> str:
    """Starts the daemon, expects exit 78, and returns its one line on stderr."""
    before = daemon.log_text()
    daemon.start(expect_ready=False)
    assert daemon.wait_exit() == EX_CONFIG, daemon.log_text()[len(before):]
    lines = [l for l in daemon.log_text()[len(before):].splitlines() if l.startswith("kioskauthd: ")]
    assert len(lines) == 1, daemon.log_text()[len(before):]
    # The socket is bound while the store is opened; a refused start must not leave it behind.
    assert not os.path.exists(daemon.socket), "the refused start left its socket behind"
    return lines[0]


def test_an_edited_activation_code_is_store_integrity_and_audited(daemon):
    code = add_with_code(daemon, "sarah")
    for edit in ("UPDATE activation_codes SET failures = 0, expires_at = expires_at + 864000",):
        with sqlite3.connect(daemon.state / DB) as conn:
            conn.execute(edit)
        r = Terminal(daemon).call("CheckActivationCode", code=code)
        assert r.get("error") == "io.kioskauth.StoreIntegrity", r
    events = audit_events(daemon)
    assert any(e["action"] == "store.integrity" and "activation_codes row" in (e.get("detail") or "") for e in events)
    # And the store is refused at the next start, not served.
    daemon.stop()
    assert "activation_codes row" in refused(daemon)


def test_an_edited_identify_throttle_is_refused_at_start_not_reset(daemon):
    add(daemon, "sarah")
    daemon.stop()
    with sqlite3.connect(daemon.state / DB) as conn:
        conn.execute("INSERT OR REPLACE INTO terminal_state (key, value) VALUES ('identify-throttle', '{}')")
    assert "terminal_state row" in refused(daemon)


def test_wrong_short_and_missing_key(make_daemon):
    d = make_daemon(credential_key=os.urandom(32)).start()
    add(d, "sarah")
    d.stop()
    key = d.credentials / "kioskauth.store-key"
    key.chmod(0o600)
    key.write_bytes(os.urandom(32))
    assert "does not open this store" in refused(d)
    key.write_bytes(os.urandom(7))
    assert "key" in refused(d)
    key.unlink()
    assert "key" in refused(d)


def test_a_read_only_state_directory_says_read_only_and_which_path(make_daemon):
    d = make_daemon(credential_key=os.urandom(32)).start()
    add(d, "sarah")
    d.stop()
    d.state.chmod(0o500)
    # Root would write anyway; without CAP_DAC_OVERRIDE it is refused like any other user.
    d.prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    try:
        line = refused(d)
    finally:
        d.state.chmod(0o700)
    assert "read-only" in line and str(d.state) in line, line
    assert "code 14" not in line


def flip_byte(path, query):
    """Flips a byte in the middle of a live value (query's one blob) where the file holds it, or
    (query None) the b-tree page-type byte of the people table's root page."""
    with sqlite3.connect(path) as conn:
        (page,) = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'people'").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        value = conn.execute(query).fetchone()[0] if query else None
    data = bytearray(open(path, "rb").read())
    offset = (page - 1) * page_size if value is None else data.index(value) + len(value) // 2
    data[offset] ^= 0x5A
    open(path, "wb").write(bytes(data))


def test_flipped_pages_in_people_or_secrets_are_refused_at_start(make_daemon):
    for query in ("SELECT mac FROM people", "SELECT sealed FROM secrets", None):
        d = make_daemon().start()
        add(d, "sarah")
        assert set_passcode(d, "sarah", "482913").returncode == 0
        d.stop()  # a clean stop checkpoints the WAL into the file
        flip_byte(d.state / DB, query)
        line = refused(d)
        assert "integrity" in line or "damaged" in line or "not a valid" in line, (query, line)


def test_a_deleted_wal_after_kill_9_with_acknowledged_writes_is_refused_then_accepted(daemon):
    add(daemon, "sarah")
    assert set_passcode(daemon, "sarah", "482913").returncode == 0
    daemon.restart()
    for name in ("omar", "lena", "ivo"):
        add(daemon, name)
    for _ in range(2):
        assert verify(daemon, "sarah", "000000").returncode != 0
    head = audit_events(daemon)[-1]["sequence"]
    daemon.kill()
    for suffix in ("-wal", "-shm"):
        (daemon.state / (DB + suffix)).unlink(missing_ok=True)
    line = refused(daemon)
    assert "behind its audit head anchor" in line and f"entry {head}" in line, line
    daemon.extra_args = ["--accept-store-rollback"]
    daemon.start()
    daemon.extra_args = []
    events = audit_events(daemon)
    accepted = [e for e in events if e["action"] == "store.rollback.accepted"]
    assert len(accepted) == 1 and f"entry {head}" in accepted[0]["detail"], accepted
    assert daemon.ctl("audit", "verify").returncode == 0
    # Accepted once: the next start is normal.
    daemon.restart()


def test_a_deleted_or_emptied_database_is_refused(daemon):
    add(daemon, "sarah")
    daemon.stop()
    for suffix in ("", "-wal", "-shm"):
        (daemon.state / (DB + suffix)).unlink(missing_ok=True)
    line = refused(daemon)
    assert "missing" in line and "records store" in line, line
    assert not (daemon.state / DB).exists()
    (daemon.state / DB).write_bytes(b"")
    line = refused(daemon)
    assert "empty" in line, line
    daemon.extra_args = ["--accept-store-rollback"]
    daemon.start()
    daemon.extra_args = []
    assert any(e["action"] == "store.rollback.accepted" for e in audit_events(daemon))
    r = daemon.ctl("user", "list")
    assert "sarah" not in r.stdout
