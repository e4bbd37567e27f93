"""Audit delivery: the real kioskauthd sends its audit trail to a real HTTP collector written
here (http.server on 127.0.0.1, an ephemeral port, its own thread, gone after its lifetime), which
records every request and can be switched between up, down (port closed), failing (500),
refusing (401), hanging (accepts, reads, never answers) and losing the answer (stores the batch,
then drops the connection).

Run: python3 -m pytest tests/test_audit_delivery.py
"""

from __future__ import annotations

import json
import socket
import sqlite3
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from idp_testing import Connection, ok, wait_until
from kioskauth_testing import FAST_HASH_CONFIG

TOKEN = "audit-token-4f1c9e.Zq_~+/="
PASSCODE = "482913"
BATCH = 5


class Collector:
    """An audit collector on loopback. `mode` decides how the next requests are answered."""

    MODES = ("up", "down", "error", "reject", "hang", "lose", "throttle-forever")

    def __init__(self, lifetime: float = 240.0):
        self.lock = threading.Lock()
        self.mode = "up"
        self.attempts: list[dict] = []  # every request that arrived, in order
        self.stored: list[dict] = []  # events kept (accepted, or kept before a lost answer)
        self.aborted = 0  # requests whose body never arrived
        self.release = threading.Event()  # ends hanging requests
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self._listen()
        # Stops by itself, whatever happens to the test.
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True
        self.timer.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/audit"

    def _listen(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def read_body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    body = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return body
                        body += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.read_body()
                expected = self.headers.get("Content-Length")
                if expected is not None and len(raw) < int(expected):
                    # The client gave up before its body arrived (a request it timed out on).
                    with collector.lock:
                        collector.aborted += 1
                    self.close_connection = True
                    return
                with collector.lock:
                    mode = collector.mode
                    body = json.loads(raw)
                    collector.attempts.append(
                        {"mode": mode, "path": self.path, "headers": dict(self.headers.items()), "raw": raw,
                         "body": body, "at": time.monotonic()})
                    if mode in ("up", "lose"):
                        collector.stored.extend(body["events"])
                if mode == "up":
                    self.answer(200, {"accepted": len(body["events"])})
                elif mode == "error":
                    self.answer(500, {"error": "collector unwell"})
                elif mode == "reject":
                    self.answer(401, {"error": "bad token"})
                elif mode == "throttle-forever":
                    # The largest delay-seconds a signed 64-bit integer holds.
                    data = b"{}"
                    self.send_response(429)
                    self.send_header("Retry-After", "9223372036854775807")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    if mode == "hang":
                        collector.release.wait(60)
                    # "lose": the batch is stored, and the answer never leaves.
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def set_mode(self, mode: str) -> None:
        assert mode in self.MODES
        with self.lock:
            previous, self.mode = self.mode, mode
        if previous == "hang":
            self.release.set()
        if mode == "hang":
            self.release.clear()
        if mode == "down" and self.server is not None:
            self.server.shutdown()
            self.server.server_close()  # the port is closed: connections are refused
            self.server = None
        elif mode != "down" and self.server is None:
            self._listen()  # the same port again

    def close(self) -> None:
        self.release.set()
        if self.server is not None:
            server, self.server = self.server, None
            server.shutdown()
            server.server_close()

    def stored_ids(self) -> list[str]:
        with self.lock:
            return [event["id"] for event in self.stored]

    def attempts_in(self, *modes: str) -> list[dict]:
        with self.lock:
            return [a for a in self.attempts if a["mode"] in modes]


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def delivery_config(url: str, extra: str = "") -> str:
    return FAST_HASH_CONFIG + f"""
[Fingerprint]
Enabled=no

[AuditDelivery]
Endpoint={url}
TokenCredential=audit-token
BatchSize={BATCH}
RequestTimeoutSec=1
InitialBackoffSec=0.2
MaximumBackoffSec=1
""" + extra


def make_delivery_daemon(make_daemon, url: str, extra: str = "", token: str | None = TOKEN):
    d = make_daemon(config=delivery_config(url, extra))
    credentials = d.root / "audit-credentials"
    credentials.mkdir(mode=0o700)
    if token is not None:
        (credentials / "audit-token").write_text(token + "\n")
    d.extra_env["CREDENTIALS_DIRECTORY"] = str(credentials)
    return d


def add_person(d, name="sarah", passcode=PASSCODE):
    r = d.ctl("user", "add", name, "--display-name", name.title())
    assert r.returncode == 0, r.stderr
    r = d.ctl("passcode", "set", name, input=f"{passcode}\n{passcode}\n")
    assert r.returncode == 0, r.stderr


def unlocks(conn: Connection, count: int, name="sarah") -> list[float]:
    """`count` passcode unlocks on one connection; their latencies in seconds."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        ok(conn.call("VerifyPasscode", {"name": name, "passcode": PASSCODE}))
        samples.append(time.perf_counter() - started)
    return samples


def trail(d) -> list[dict]:
    r = d.ctl("audit", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["events"]


def delivery(d, user: str | None = None) -> dict:
    r = d.ctl("status", "--json", user=user)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["auditDelivery"]


def wait_delivered(d, timeout=20.0) -> dict:
    """Waits until the endpoint acknowledged the whole trail (as the daemon reports it)."""
    def done():
        status = delivery(d)
        head = trail(d)[-1]["sequence"]
        return status if status["queued"] == 0 and status.get("deliveredThrough") == head else None
    return wait_until(done, timeout, message="the whole trail to be delivered")


def sequences(events: list[dict]) -> list[int]:
    return [e["sequence"] for e in events]


def test_when_up_every_event_is_delivered_in_order_with_what_it_takes_to_check_it(make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    conn = Connection(d.socket)
    unlocks(conn, 7)
    wrong = conn.call("VerifyPasscode", {"name": "sarah", "passcode": "000001"})
    assert wrong["error"] == "io.kioskauth.WrongPasscode"
    conn.close()
    status = wait_delivered(d)

    events = trail(d)
    assert len(events) >= 10
    # Everything, once each, in order, as the trail holds it.
    assert sequences(collector.stored) == list(range(1, len(events) + 1))
    for sent, kept in zip(collector.stored, events):
        for field in ("sequence", "action", "result", "person", "method", "callerUid", "callerPid", "service",
                      "detail", "mac"):
            assert sent.get(field) == kept.get(field), (field, sent, kept)
        assert sent["time"][:23] == kept["time"][:23]
        assert sent["id"].split("-")[1] == str(kept["sequence"])
        assert sent["mac"].startswith(sent["id"].split("-")[2])
    assert {"passcode.verify"} <= {e["action"] for e in collector.stored}
    assert any(e["result"] == "failure" for e in collector.stored)
    # One stream, named in every batch; batches in order and never larger than BatchSize.
    batches = [a["body"] for a in collector.attempts]
    assert {b["format"] for b in batches} == {"io.kioskauth.audit.v1"}
    assert len({b["terminal"]["stream"] for b in batches}) == 1
    assert all(e["id"].startswith(batches[0]["terminal"]["stream"] + "-") for e in collector.stored)
    assert all(1 <= len(b["events"]) <= BATCH for b in batches)
    firsts = [b["events"][0]["sequence"] for b in batches]
    assert firsts == sorted(firsts)
    # The request itself: the bearer token from the credential, JSON, a batch key.
    for attempt in collector.attempts:
        assert attempt["path"] == "/v1/audit"
        assert attempt["headers"]["Authorization"] == f"Bearer {TOKEN}"
        assert attempt["headers"]["Content-Type"] == "application/json"
        assert attempt["headers"]["Idempotency-Key"].startswith(batches[0]["terminal"]["stream"] + "-")
        # No secret ever leaves: not the passcodes, not the token in the body.
        assert PASSCODE.encode() not in attempt["raw"] and b"000001" not in attempt["raw"]
        assert TOKEN.encode() not in attempt["raw"]
    assert status["state"] == "idle"
    assert status["lastDeliveryAt"]
    assert status["endpointHost"] == f"127.0.0.1:{collector.port}"
    assert "lastError" not in status or status["lastError"] is None


def test_while_down_events_queue_with_the_error_shown_and_go_out_when_it_is_back(make_daemon, collector):
    collector.set_mode("down")
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    conn = Connection(d.socket)
    unlocks(conn, 6)
    conn.close()
    head = trail(d)[-1]["sequence"]

    status = wait_until(lambda: (s := delivery(d))["state"] == "retrying" and s["queued"] >= head and s,
                        10, message="the queue and the error in the status")
    assert status["configured"] is True
    assert status["deliveredThrough"] == 0
    assert "cannot connect" in status["lastError"]
    assert status["consecutiveFailures"] >= 1
    assert status["lastErrorAt"] and status["nextAttemptAt"]
    assert status.get("lastDeliveryAt") is None
    human = d.ctl("status")
    assert human.returncode == 0, human.stderr
    assert f"audit delivery: retrying to 127.0.0.1:{collector.port}" in human.stdout
    assert "events queued, last delivery never" in human.stdout
    assert "last error: cannot connect" in human.stdout
    # An ordinary local user sees that events wait, not where they go or why they fail.
    seen = delivery(d, user="nobody")
    assert seen["state"] == "retrying" and seen["queued"] >= head
    for admin_only in ("endpointHost", "lastError", "lastErrorAt", "deliveredThrough", "nextAttemptAt",
                       "consecutiveFailures"):
        assert seen.get(admin_only) is None, admin_only
    plain = d.ctl("status", user="nobody")
    assert "audit delivery: retrying," in plain.stdout and "127.0.0.1" not in plain.stdout
    assert "last error" not in plain.stdout

    collector.set_mode("up")
    status = wait_delivered(d)
    assert status["state"] == "idle" and status["queued"] == 0
    assert status["lastDeliveryAt"]
    assert status.get("lastError") is None and status["consecutiveFailures"] == 0
    assert sorted(set(sequences(collector.stored))) == list(range(1, status["deliveredThrough"] + 1))


def test_after_a_500_the_same_batch_is_retried_without_loss_or_reordering(make_daemon, collector):
    collector.set_mode("error")
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    conn = Connection(d.socket)
    unlocks(conn, 12)
    conn.close()
    wait_until(lambda: len(collector.attempts_in("error")) >= 3, 10, message="three failed attempts")
    status = delivery(d)
    assert status["state"] == "retrying" and "HTTP 500" in status["lastError"]
    assert status["deliveredThrough"] == 0

    collector.set_mode("up")
    status = wait_delivered(d)
    # Nothing lost, nothing twice, nothing out of order.
    assert sequences(collector.stored) == list(range(1, status["deliveredThrough"] + 1))
    # The failed batch went out again as it was: same range, same bytes, same key.
    failed = collector.attempts_in("error")
    first_ok = collector.attempts_in("up")[0]
    assert first_ok["raw"] == failed[-1]["raw"]
    assert first_ok["headers"]["Idempotency-Key"] == failed[0]["headers"]["Idempotency-Key"]
    assert first_ok["body"]["events"][0]["sequence"] == 1


def test_after_a_lost_answer_the_same_ids_are_sent_again_and_the_collector_dedupes(make_daemon, collector):
    collector.set_mode("lose")
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    wait_until(lambda: len(collector.attempts_in("lose")) >= 2, 10, message="two lost answers")
    status = delivery(d)
    assert status["state"] == "retrying"
    assert "closed before an answer" in status["lastError"]

    collector.set_mode("up")
    status = wait_delivered(d)
    ids = collector.stored_ids()
    lost = {e["id"] for a in collector.attempts_in("lose") for e in a["body"]["events"]}
    accepted = {e["id"] for a in collector.attempts_in("up") for e in a["body"]["events"]}
    assert lost and lost <= accepted  # the same ids again, not new ones
    assert len(ids) > len(set(ids))  # the collector did receive repeats ...
    assert len(set(ids)) == status["deliveredThrough"] == len(trail(d))  # ... and dedupes to the trail
    by_id = {}
    for event in collector.stored:
        assert by_id.setdefault(event["id"], event) == event  # a repeat is the same event


def test_a_restart_resumes_from_the_durable_cursor_and_resends_nothing_acknowledged(make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    acknowledged = wait_delivered(d)["deliveredThrough"]
    collector.set_mode("down")
    conn = Connection(d.socket)
    unlocks(conn, 4)
    conn.close()
    wait_until(lambda: delivery(d)["state"] == "retrying", 10, message="a failed attempt")
    d.stop()
    with sqlite3.connect(d.state / "kioskauth.sqlite") as db:
        (value,) = db.execute("SELECT value FROM terminal_state WHERE key = 'audit_delivery'").fetchone()
        (head,) = db.execute("SELECT MAX(seq) FROM audit").fetchone()
    cursor = json.loads(value)
    assert cursor["deliveredThrough"] == acknowledged
    assert cursor["endpoint"] == collector.url
    before = len(collector.attempts)

    d.start()
    status = delivery(d)
    assert status["deliveredThrough"] == acknowledged
    assert status["queued"] >= head - acknowledged + 1  # and the new daemon.start
    collector.set_mode("up")
    status = wait_delivered(d)
    resent = [e["sequence"] for a in collector.attempts[before:] for e in a["body"]["events"]]
    assert resent and min(resent) == acknowledged + 1
    assert sequences(collector.stored) == list(range(1, status["deliveredThrough"] + 1))


def test_from_the_first_status_after_a_restart_the_cursor_is_the_durable_one(make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    acknowledged = wait_delivered(d)["deliveredThrough"]
    collector.set_mode("down")
    d.stop()
    # The delivery service starts late (a debug-build hook), as it may on a busy terminal: the
    # status must not show the whole trail as queued meanwhile.
    d.extra_env["KIOSKAUTH_TEST_AUDIT_DELIVERY_START_DELAY"] = "3"
    running = d.log_text().count("audit delivery running")  # the log is kept across restarts
    d.start()
    r = d.ctl("status", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert d.log_text().count("audit delivery running") == running  # the service had not started yet
    wait_until(lambda: "TEST HOOK ACTIVE: audit delivery starts" in d.log_text(), 5, message="the hook")
    assert status["auditDelivery"]["deliveredThrough"] == acknowledged
    assert status["auditDelivery"]["queued"] == status["auditEvents"] - acknowledged > 0
    assert status["auditDelivery"]["lastDeliveryAt"]


def test_a_hanging_endpoint_does_not_slow_down_passcode_unlock(make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    conn = Connection(d.socket)
    unlocks(conn, 3)  # warm up
    up = statistics.median(unlocks(conn, 15))
    collector.set_mode("hang")
    # The events so far may all be delivered already: queue one that can only go out hanging.
    unlocks(conn, 1)
    wait_until(lambda: collector.attempts_in("hang"), 10, message="a hanging request")
    samples = unlocks(conn, 15)  # each one queues another event behind the hanging request
    hung, worst = statistics.median(samples), max(samples)
    assert len(collector.attempts_in("hang")) >= 1
    status = delivery(d)
    conn.close()
    # The same order as with the endpoint up, and nowhere near the 1 s request timeout.
    print(f"passcode unlock median: endpoint up {up * 1000:.1f} ms, hanging {hung * 1000:.1f} ms")
    assert hung < up * 2 + 0.05, (up, hung)
    assert worst < 1.0, worst
    assert status["queued"] >= 15
    collector.set_mode("up")
    wait_delivered(d)
    assert len(set(collector.stored_ids())) == len(trail(d))


def test_a_hanging_endpoint_does_not_hold_up_shutdown_and_its_batch_goes_out_after_the_restart(
        make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url, extra="RequestTimeoutSec=30\n").start()
    add_person(d)
    wait_delivered(d)
    acknowledged = len(collector.stored)
    collector.set_mode("hang")
    conn = Connection(d.socket)
    unlocks(conn, 2)
    conn.close()
    wait_until(lambda: collector.attempts_in("hang"), 10, message="a hanging request")
    started = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - started < 5  # not the 30 s request timeout
    hung = {e["id"] for a in collector.attempts_in("hang") for e in a["body"]["events"]}
    collector.set_mode("up")
    d.start()
    wait_delivered(d)
    # Never acknowledged, so sent again under the same ids; nothing acknowledged went again.
    assert hung <= set(collector.stored_ids()[acknowledged:])
    assert len(set(collector.stored_ids())) == len(collector.stored_ids()) == len(trail(d))


def test_an_endpoint_asking_to_wait_forever_is_waited_for_at_most_the_backoff_cap(make_daemon, collector):
    # Retry-After: 2^63 - 1 seconds, from the endpoint or anything posing as it: the daemon stays
    # up (formatting the wait trapped it), says what it was told, and retries at its own cap.
    collector.set_mode("throttle-forever")
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    wait_until(lambda: len(collector.attempts_in("throttle-forever")) >= 2, 10, message="a retry at the cap")
    assert d.proc.poll() is None, d.log_text()[-2000:]
    status = delivery(d)
    assert status["lastError"] == "the endpoint answered HTTP 429, retry after 86400 s", status
    assert status["state"] == "retrying" and status["queued"] > 0
    collector.set_mode("up")
    status = wait_delivered(d)
    assert sequences(collector.stored) == list(range(1, status["deliveredThrough"] + 1))


def test_a_new_endpoint_receives_the_whole_trail(make_daemon, collector):
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    wait_delivered(d)
    d.stop()
    other = Collector()
    try:
        d.config_path.write_text(d.config_path.read_text().replace(collector.url, other.url))
        d.start()
        status = wait_delivered(d)
        assert sequences(other.stored) == list(range(1, status["deliveredThrough"] + 1))
        # The same events under the same ids as the first endpoint got.
        assert other.stored_ids()[: len(collector.stored)] == collector.stored_ids()
        assert "the audit endpoint changed" in d.log_text()
    finally:
        other.close()


def test_a_refusing_endpoint_is_reported_and_nothing_is_dropped(make_daemon, collector):
    collector.set_mode("reject")
    d = make_delivery_daemon(make_daemon, collector.url).start()
    add_person(d)
    status = wait_until(lambda: (s := delivery(d)).get("lastError") and s, 10, message="the refusal")
    assert "HTTP 401" in status["lastError"] and "TokenCredential=" in status["lastError"]
    assert status["deliveredThrough"] == 0 and status["queued"] > 0
    # Retried at the cap (MaximumBackoffSec=1, less up to 20 % jitter), not dropped or abandoned.
    wait_until(lambda: len(collector.attempts_in("reject")) >= 3, 10, message="retries at the cap")
    rejected = collector.attempts_in("reject")
    gaps = [b["at"] - a["at"] for a, b in zip(rejected, rejected[1:])]
    assert all(gap >= 0.75 for gap in gaps), gaps
    assert "refuses the batch" in d.log_text()
    collector.set_mode("up")
    status = wait_delivered(d)
    assert sequences(collector.stored) == list(range(1, status["deliveredThrough"] + 1))


def test_without_an_endpoint_nothing_is_sent_and_the_status_says_off(make_daemon, collector):
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n").start()
    add_person(d)
    status = delivery(d)
    assert status == {"configured": False, "state": "off", "queued": 0}
    assert "audit delivery: off" in d.ctl("status").stdout
    time.sleep(0.5)
    assert collector.attempts == []


@pytest.mark.parametrize("config, token, message", [
    pytest.param({"Endpoint": "http://audit.example.org/v1"}, TOKEN,
                 "[AuditDelivery] Endpoint=http://audit.example.org/v1: plain http:// is allowed only to loopback",
                 id="remote-plain-http"),
    pytest.param({"Endpoint": "https://user:pw@audit.example.org/v1"}, TOKEN,
                 "the URL must not contain credentials", id="credentials-in-url"),
    pytest.param({}, None,
                 "[AuditDelivery] TokenCredential: cannot read credential audit-token in $CREDENTIALS_DIRECTORY",
                 id="missing-credential"),
    pytest.param({}, "two words",
                 "[AuditDelivery]: the bearer token must be one line of visible ASCII", id="unusable-token"),
    pytest.param({"MaximumBackoffSec": "1", "InitialBackoffSec": "5"}, TOKEN,
                 "MaximumBackoffSec is shorter than InitialBackoffSec", id="backoff-order"),
])
def test_bad_configuration_is_a_named_startup_error(make_daemon, collector, config, token, message):
    d = make_delivery_daemon(make_daemon, collector.url, token=token)
    text = d.config_path.read_text()
    for key, value in config.items():
        text = "\n".join(f"{key}={value}" if line.startswith(f"{key}=") else line for line in text.splitlines())
    d.config_path.write_text(text + "\n")
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert message in d.log_text(), d.log_text()
    assert TOKEN not in d.log_text()
    assert collector.attempts == []
