"""Watching kioskauthd (issue 16): metrics over the socket and in a textfile, journal messages with
catalogued MESSAGE_IDs and KIOSKAUTH_* fields, and `kioskauthctl status`."""

import json
import os
import re
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fprint_virtual import environment
from kioskauth_testing import FAST_HASH_CONFIG, REPO, Daemon, ensure_group

ADMIN_GROUP = "kioskauth-admin"
AUTH_GROUP = "kioskauth"
PERMISSION_DENIED = "io.kioskauth.PermissionDenied"

# Every metric the daemon documents (docs/observability.md).
METRICS = {
    "kioskauth_unlocks_total": "counter",
    "kioskauth_identify_duration_seconds": "histogram",
    "kioskauth_verify_duration_seconds": "histogram",
    "kioskauth_passcode_lockouts_total": "counter",
    "kioskauth_offline": "gauge",
    "kioskauth_offline_window_people": "gauge",
    "kioskauth_offline_window_min_remaining_seconds": "gauge",
    "kioskauth_token_refreshes_total": "counter",
    "kioskauth_audit_delivery_queued_events": "gauge",
    "kioskauth_audit_delivery_lag_seconds": "gauge",
    "kioskauth_readers_present": "gauge",
    "kioskauth_reader_errors_total": "counter",
    "kioskauth_socket_connections_total": "counter",
    "kioskauth_socket_refusals_total": "counter",
    "kioskauth_people": "gauge",
    "kioskauth_people_passcode_locked": "gauge",
}
# The only label values a metric may carry: fixed sets, never a person's name, uid or id.
LABEL_VALUES = {
    "method": {"passcode", "fingerprint", "idp-password", "idp-device", "other"},
    "result": {"success", "failure", "refused", "other"},
    "kind": {"delay", "hard"},
    "outcome": {"success", "invalid_grant", "response_lost", "unreachable", "timed_out", "server_error", "other"},
    "error": {"unavailable", "removed", "full", "scan_timeout"},
    "reason": {"too_many_connections", "shutting_down", "rate_limited", "message_too_large", "malformed",
               "permission_denied"},
    "state": {"open", "expired", "never", "suspended", "clock-went-backwards"},
}
# Labels that name a store failure's context in a log line, never an audit entry's action.
STORE_LABELS_ONLY = {"status", "clock", "connectivity", "offline-window"}

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
                    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? (\S+)$')


def parse_exposition(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    """A strict reader of the Prometheus text format (0.0.4): every sample line must parse, every
    family must be typed before its samples, and the text must end in a newline."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels_text, value = match.group(1), match.group(3), match.group(4)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, f"{name} has no # TYPE line"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_text or ""))
        samples.append((name, labels, float(value)))
    return types, samples


def value(samples, name: str, **labels) -> float:
    found = [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items())]
    return sum(found)


def set_passcode(d, name: str, code: str):
    r = d.ctl("passcode", "set", name, input=f"{code}\n{code}\n")
    assert r.returncode == 0, r.stderr


def metrics(d) -> tuple[dict[str, str], list]:
    r = d.ctl("metrics")
    assert r.returncode == 0, r.stderr
    return parse_exposition(r.stdout)


def trail(d) -> list[dict]:
    return json.loads(d.ctl("audit", "--json").stdout)["events"]


# --- Metrics over the socket ---------------------------------------------------------------------


def test_metrics_countUnlocksLockoutsAndLatency_andNameNobody(daemon):
    assert daemon.ctl("user", "add", "sarah.connor", "--display-name", "Sarah Connor").returncode == 0
    set_passcode(daemon, "sarah.connor", "482913")
    assert daemon.call("io.kioskauth.VerifyPasscode", {"name": "sarah.connor", "passcode": "482913"}).get("error") is None
    for _ in range(3):
        assert daemon.call("io.kioskauth.VerifyPasscode",
                           {"name": "sarah.connor", "passcode": "111113"})["error"] == "io.kioskauth.WrongPasscode"

    r = daemon.ctl("metrics")
    assert r.returncode == 0, r.stderr
    types, samples = parse_exposition(r.stdout)
    for name, kind in METRICS.items():
        assert types.get(name) == kind, (name, types.get(name))

    # Unlocks match the audit trail, by method and result.
    events = [e for e in trail(daemon) if e["action"] == "passcode.verify"]
    for result in ("success", "failure"):
        expected = sum(1 for e in events if e["result"] == result)
        assert expected > 0
        assert value(samples, "kioskauth_unlocks_total", method="passcode", result=result) == expected, result
    assert value(samples, "kioskauth_verify_duration_seconds_count", method="passcode", result="success") == 1
    assert value(samples, "kioskauth_verify_duration_seconds_count", method="passcode", result="failure") == 3
    assert value(samples, "kioskauth_verify_duration_seconds_sum", method="passcode") > 0
    # The third wrong passcode starts the first delay.
    assert value(samples, "kioskauth_passcode_lockouts_total", kind="delay") == 1
    assert value(samples, "kioskauth_passcode_lockouts_total", kind="hard") == 0
    assert value(samples, "kioskauth_people") == 1
    assert value(samples, "kioskauth_people_passcode_locked") == 1
    assert value(samples, "kioskauth_socket_connections_total") >= 6
    assert value(samples, "kioskauth_offline") == 0

    # Nobody is named: no label value outside the fixed sets, and the names appear nowhere.
    for name, labels, _ in samples:
        for label, text in labels.items():
            if label == "le":
                float(text)
                continue
            assert text in LABEL_VALUES[label], (name, label, text)
    person = json.loads(daemon.ctl("user", "show", "sarah.connor", "--json").stdout)["person"]
    for secret in ("sarah", "Sarah", "connor", "482913", "111113"):
        assert secret not in r.stdout
    assert person["name"] not in r.stdout


def test_metrics_onlyRootAndAdmins_othersGetPermissionDenied(daemon):
    ensure_group(ADMIN_GROUP)
    ensure_group(AUTH_GROUP)
    for user, groups in (("nobody", None), ("nobody", [AUTH_GROUP])):
        reply = daemon.call("io.kioskauth.GetMetrics", user=user, groups=groups)
        assert reply.get("error") == PERMISSION_DENIED, (groups, reply)
        assert "parameters" not in reply or "text" not in (reply.get("parameters") or {})
        r = daemon.ctl("metrics", user=user, groups=groups)
        assert r.returncode == 1 and r.stdout == "", r
        assert "metrics needs root or membership in kioskauth-admin" in r.stderr
    admin = daemon.call("io.kioskauth.GetMetrics", user="nobody", groups=[ADMIN_GROUP])
    assert "error" not in admin, admin
    _, samples = parse_exposition(admin["parameters"]["text"])
    # The two refusals above are counted (the kioskauth member's was also audited).
    assert value(samples, "kioskauth_socket_refusals_total", reason="permission_denied") >= 4
    refused = [e for e in trail(daemon) if e["action"] == "metrics"]
    assert refused and all(e["result"] == "refused" for e in refused)


def test_metrics_textfile_isReplacedAtomically_mode0644(make_daemon, tmp_path):
    directory = tmp_path / "textfile"
    directory.mkdir()
    target = directory / "kioskauth.prom"
    d = make_daemon(config=FAST_HASH_CONFIG + f"[Metrics]\nTextfilePath={target}\nTextfileIntervalSec=1\n")
    d.start()
    deadline = time.monotonic() + 15
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert target.exists(), d.log_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    parse_exposition(target.read_text())
    assert d.ctl("user", "add", "noor").returncode == 0

    def people_in_file():
        _, samples = parse_exposition(target.read_text())
        return value(samples, "kioskauth_people")

    deadline = time.monotonic() + 15
    while people_in_file() != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert people_in_file() == 1
    # Each rewrite is a new inode (rename), and no temporary file is left behind.
    inode = target.stat().st_ino
    deadline = time.monotonic() + 15
    while target.stat().st_ino == inode and time.monotonic() < deadline:
        time.sleep(0.2)
    assert target.stat().st_ino != inode
    assert d.stop() == 0
    assert sorted(p.name for p in directory.iterdir()) == ["kioskauth.prom"]


def test_metrics_textfile_unwritableDirectory_isLoggedAndTheDaemonServes(make_daemon, tmp_path):
    target = tmp_path / "missing" / "kioskauth.prom"
    d = make_daemon(config=FAST_HASH_CONFIG + f"[Metrics]\nTextfilePath={target}\n")
    d.start()
    assert d.ctl("status").returncode == 0
    deadline = time.monotonic() + 10
    while "cannot write the metrics textfile" not in d.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "cannot write the metrics textfile" in d.log_text()
    assert not target.exists()


@pytest.mark.parametrize("path", ["relative/kioskauth.prom", "/var/lib/node/kioskauth.txt", "/a/../b.prom"])
def test_metrics_textfilePath_mustBeAbsoluteProm(make_daemon, path):
    d = make_daemon(config=FAST_HASH_CONFIG + f"[Metrics]\nTextfilePath={path}\n")
    d.start(expect_ready=False)
    assert d.wait_exit() != 0
    assert "[Metrics] TextfilePath" in d.log_text()


# --- The journal ---------------------------------------------------------------------------------


def message_ids() -> tuple[dict[str, str], str]:
    source = (REPO / "Sources/KioskAuthDaemon/AuditMessageIDs.swift").read_text()
    table = dict(re.findall(r'^\s+"([a-z][a-z.-]*)": "([0-9a-f]{32})",$', source, re.M))
    other = re.search(r'static let other = "([0-9a-f]{32})"', source).group(1)
    return table, other


def catalog_ids() -> list[str]:
    return re.findall(r"^-- ([0-9a-f]{32})$", (REPO / "systemd/kioskauth.catalog").read_text(), re.M)


def test_catalog_andTheCodeHaveTheSameIds_andEveryAuditedActionHasOne():
    table, other = message_ids()
    ids = list(table.values()) + [other]
    assert len(set(ids)) == len(ids), "an id is used twice"
    listed = catalog_ids()
    assert len(set(listed)) == len(listed), "the catalog lists an id twice"
    assert set(listed) == set(ids)
    audited = set()
    for path in (REPO / "Sources").rglob("*.swift"):
        audited |= set(re.findall(r'action: "([a-z][a-z.-]*)"', path.read_text()))
    audited |= {"store.rollback.accepted"}  # appended by the store itself
    missing = audited - STORE_LABELS_ONLY - set(table)
    assert not missing, f"audited actions without a MESSAGE_ID: {sorted(missing)}"


def test_catalog_isAcceptedBySystemdsJournalctl(tmp_path):
    catalog_dir = tmp_path / "usr/lib/systemd/catalog"
    catalog_dir.mkdir(parents=True)
    (catalog_dir / "kioskauth.catalog").write_bytes((REPO / "systemd/kioskauth.catalog").read_bytes())
    r = subprocess.run(["journalctl", f"--root={tmp_path}", "--update-catalog"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r
    r = subprocess.run(["journalctl", f"--root={tmp_path}", "--list-catalog"], capture_output=True, text=True)
    assert r.returncode == 0, r
    listed = {line.split(" ", 1)[0] for line in r.stdout.splitlines() if line}
    table, other = message_ids()
    assert listed == set(table.values()) | {other}
    # Each entry says what happened and what to do, and journalctl fills in the fields.
    entry = subprocess.run(["journalctl", f"--root={tmp_path}", "--dump-catalog", table["passcode.verify"]],
                           capture_output=True, text=True)
    assert "What to do:" in entry.stdout and "@KIOSKAUTH_RESULT@" in entry.stdout, entry
    # A damaged catalog is refused: the check can fail.
    (catalog_dir / "kioskauth.catalog").write_text("-- not-an-id\nSubject: x\n")
    broken = subprocess.run(["journalctl", f"--root={tmp_path}", "--update-catalog"], capture_output=True, text=True)
    assert broken.returncode != 0 or "kioskauth.catalog" in broken.stderr


def parse_datagram(data: bytes) -> dict[str, str]:
    """journald's native protocol: FIELD=value lines, or FIELD, newline, 64-bit LE size, value."""
    fields, i = {}, 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            key, val = line.split(b"=", 1)
            i = end + 1
        else:
            key = line
            size = int.from_bytes(data[end + 1:end + 9], "little")
            val = data[end + 9:end + 9 + size]
            assert data[end + 9 + size:end + 10 + size] == b"\n"
            i = end + 10 + size
        fields[key.decode()] = val.decode()
    return fields


class JournalSink:
    """A datagram socket standing in for journald's /run/systemd/journal/socket."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)
        self.messages: list[dict[str, str]] = []
        self.lock = threading.Lock()
        # Read all the time, as journald does: the daemon never waits for a full queue (it
        # writes the line to standard error instead), so a sink that read only when asked
        # would miss what came while the queue (net.unix.max_dgram_qlen, often 10) was full.
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            with self.lock:
                self.messages.append(parse_datagram(data))

    def drain(self, timeout: float = 0.5) -> list[dict[str, str]]:
        time.sleep(timeout)
        with self.lock:
            return list(self.messages)

    def audits(self, action: str, timeout: float = 10.0) -> list[dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.drain(0.2) if m.get("KIOSKAUTH_ACTION") == action]
            if found or time.monotonic() > deadline:
                return found


def test_journal_auditEventsCarryMessageIdAndFields_onUnlockAndRefusal(make_daemon, tmp_path):
    ensure_group(AUTH_GROUP)
    sink = JournalSink(tmp_path / "journal.sock")
    d = make_daemon(env={"KIOSKAUTH_JOURNAL_SOCKET": str(sink.path)})
    d.start()
    table, _ = message_ids()
    started = sink.audits("daemon.start")
    assert started and started[0]["MESSAGE_ID"] == table["daemon.start"]
    assert d.ctl("user", "add", "sarah").returncode == 0
    set_passcode(d, "sarah", "482913")
    assert d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"}).get("error") is None
    # A greeter's account (kioskauth group) may not add people: the refusal is audited.
    refused = d.ctl("user", "add", "mallory", user="nobody", groups=[AUTH_GROUP])
    assert refused.returncode == 1

    unlock = sink.audits("passcode.verify")
    assert len(unlock) == 1, unlock
    message = unlock[0]
    assert message["MESSAGE_ID"] == table["passcode.verify"]
    assert message["KIOSKAUTH_RESULT"] == "success"
    assert message["KIOSKAUTH_METHOD"] == "passcode"
    assert message["KIOSKAUTH_PERSON_ID"] == "sarah"
    assert message["MESSAGE"] == "audit"
    assert message["PRIORITY"] == "6"
    assert message["SYSLOG_IDENTIFIER"] == "kioskauthd"
    head = trail(d)
    verify = [e for e in head if e["action"] == "passcode.verify"][-1]
    assert message["AUDIT_SEQ"] == str(verify["sequence"])

    refusal = [m for m in sink.audits("person.add") if m["KIOSKAUTH_RESULT"] == "refused"]
    assert len(refusal) == 1, sink.messages
    assert refusal[0]["MESSAGE_ID"] == table["person.add"]
    assert refusal[0]["KIOSKAUTH_PERSON_ID"] == "mallory"
    assert "KIOSKAUTH_METHOD" not in refusal[0]
    # Everything the daemon logs goes there, not to standard error, while the socket works.
    assert "passcode.verify" not in d.log_text()


def test_journal_unreachableSocket_fallsBackToStandardError(make_daemon, tmp_path):
    d = make_daemon(env={"KIOSKAUTH_JOURNAL_SOCKET": str(tmp_path / "nobody-listens.sock")})
    d.start()
    assert d.ctl("user", "add", "sarah").returncode == 0
    deadline = time.monotonic() + 5
    while "person.add" not in d.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = d.log_text()
    assert "action=person.add" in log and "MESSAGE_ID=" in log and "KIOSKAUTH_PERSON_ID=sarah" in log


# --- kioskauthctl status -------------------------------------------------------------------------


STATUS_KEYS = {"version", "schemaVersion", "people", "socketActivated", "developmentKey", "uptimeSeconds",
               "auditEvents", "auditHead", "auditDelivery", "socket", "readers", "connectivity"}


def test_status_onOneScreen_andJson_forAdminsAndOthers(make_daemon, tmp_path):
    d = make_daemon(config=FAST_HASH_CONFIG)
    d.extra_env.update(environment("virtual_device", tmp_path / "sensor.sock", base={}))
    d.start()
    for name in ("sarah", "noor"):
        assert d.ctl("user", "add", name).returncode == 0
        set_passcode(d, name, "482913")
    assert d.call("io.kioskauth.VerifyPasscode", {"name": "noor", "passcode": "482913"}).get("error") is None
    time.sleep(1.1)  # RFC 3339 seconds: the second unlock is later
    assert d.call("io.kioskauth.VerifyPasscode", {"name": "sarah", "passcode": "482913"}).get("error") is None
    for _ in range(3):
        d.call("io.kioskauth.VerifyPasscode", {"name": "noor", "passcode": "111113"})

    r = d.ctl("status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 24, r.stdout
    assert lines[0].startswith("kioskauthd ") and ", up " in lines[0]
    assert any(line.startswith("reader:       virtual_device") for line in lines), r.stdout
    assert "identity provider: none configured (local people only)" in lines
    assert "people:       2" in lines
    locked = next(line for line in lines if line.startswith("locked out:"))
    assert "noor (until " in locked and "sarah" not in locked
    last = next(line for line in lines if line.startswith("last unlocks:"))
    assert last.index("sarah") < last.index("noor"), last
    assert "audit delivery: off" in r.stdout

    summary = json.loads(d.ctl("status", "--json").stdout)
    assert STATUS_KEYS | {"lockedOut", "lastUnlocks"} == set(summary)
    assert summary["people"] == 2
    assert [p["name"] for p in summary["lockedOut"]] == ["noor"]
    assert summary["lockedOut"][0]["hardLocked"] is False and summary["lockedOut"][0]["until"]
    assert [u["name"] for u in summary["lastUnlocks"]] == ["sarah", "noor"]
    assert [reader["driver"] for reader in summary["readers"]] == ["virtual_device"]
    assert summary["connectivity"]["identityProvider"] is False
    assert summary["socket"] == d.socket

    # Someone else sees the terminal, not the people.
    other = d.ctl("status", user="nobody")
    assert other.returncode == 0, other.stderr
    assert "sarah" not in other.stdout and "noor" not in other.stdout
    assert "locked out:" not in other.stdout and "last unlocks:" not in other.stdout
    assert "reader:       virtual_device" in other.stdout
    seen = json.loads(d.ctl("status", "--json", user="nobody").stdout)
    assert set(seen) == STATUS_KEYS
    # The summary is asked for: a plain GetStatus (what monitors poll) names nobody, even for
    # root, and asking for the summary as nobody gets the terminal's figures only.
    plain = d.call("io.kioskauth.GetStatus", {})["parameters"]
    assert "lockedOut" not in plain and "lastUnlocks" not in plain and plain["people"] == 2
    asked = d.call("io.kioskauth.GetStatus", {"summary": True})["parameters"]
    assert [p["name"] for p in asked["lockedOut"]] == ["noor"]
    refused = d.call("io.kioskauth.GetStatus", {"summary": True}, user="nobody")["parameters"]
    assert "lockedOut" not in refused and "lastUnlocks" not in refused
    # Asking status audits nothing, for anyone: no refusals piled up by looking.
    assert not [e for e in trail(d) if e["result"] == "refused"]


def test_status_withoutReader_saysPasscodesOnly(make_daemon):
    d = make_daemon(config=FAST_HASH_CONFIG + "[Fingerprint]\nEnabled=no\n")
    d.start()
    r = d.ctl("status")
    assert r.returncode == 0, r.stderr
    assert "reader:       none (passcodes only)" in r.stdout
    assert json.loads(d.ctl("status", "--json").stdout)["readers"] == []
    _, samples = metrics(d)
    assert value(samples, "kioskauth_readers_present") == 0


def test_journal_aJournalThatStopsReading_neverStallsTheDaemon(make_daemon, tmp_path):
    """A journal socket nobody reads (journald hung): the queue fills after a few datagrams, and
    the daemon must neither wait for it nor lose the lines (they go to standard error)."""
    path = tmp_path / "stuck.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(path))
    os.chmod(path, 0o666)
    d = make_daemon(env={"KIOSKAUTH_JOURNAL_SOCKET": str(path)})
    d.start(timeout=20)
    for name in ("sarah", "omar", "lena"):
        assert d.ctl("user", "add", name).returncode == 0
    assert d.ctl("status").returncode == 0
    # What did not fit in the queue was written as lines instead.
    assert "person.add" in d.log_text() or "ready" in d.log_text()
    stuck.close()
