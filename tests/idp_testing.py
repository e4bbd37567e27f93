"""Test support for the identity-provider, offline-window and session tests.

`IdentityServer` runs the real django-oauth-toolkit server in tests/idp/server.py on 127.0.0.1
(it exits by itself after its lifetime), with helpers to kill, restart (same port and state, so
earlier tokens stay valid), stop (SIGSTOP) and continue it, and to use its test controls.
`TestClock` writes the file named by KIOSKAUTH_TEST_CLOCK_FILE, which debug builds of kioskauthd
re-read at every clock reading. `Connection` keeps one socket open, because tickets are bound to
the connection that earned them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from kioskauth_testing import FAST_HASH_CONFIG, Daemon, connect, read_message, send_message

SERVER = Path(__file__).resolve().parent / "idp" / "server.py"
SARAH = ("sarah@clinic.example", "correct horse", "caregiver", "nurses")
READY_TIMEOUT = 60


def have_identity_server() -> bool:
    try:
        import django  # noqa: F401
        import oauth2_provider  # noqa: F401
    except ImportError:
        return False
    return True


class IdentityServer:
    """tests/idp/server.py on loopback, restartable on the same port with the same state."""

    def __init__(self, *, access_seconds=60, refresh_seconds=3600, lifetime=600, users=(SARAH,), extra=()):
        self.state_dir = Path(tempfile.mkdtemp(prefix="kioskauth-idp-"))
        self.args = [
            "--lifetime-seconds", str(lifetime), "--access-token-seconds", str(access_seconds),
            "--refresh-token-seconds", str(refresh_seconds), "--state-dir", str(self.state_dir),
            "--test-controls", "--exit-on-stdin-eof", f"--client-secret={secrets.token_urlsafe(24)}", *extra,
        ]
        for user in users:
            self.args += ["--user", ":".join(user)]
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.start()

    def start(self) -> "IdentityServer":
        cmd = [sys.executable, str(SERVER), "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + READY_TIMEOUT
        line = self.proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"identity server did not start (exit {self.proc.poll()})")
        self.info = json.loads(line)
        self.port = self.info["port"]
        return self

    @property
    def issuer(self) -> str:
        return self.info["issuer"]

    def kill(self) -> None:
        """SIGKILL: the port refuses connections until `start()`."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGSTOP: connections are accepted by the kernel and never answered."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def control(self, action: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{self.issuer}/test/{action}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"test control {action} failed: {error.code} {error.read()!r}") from None
        return json.loads(raw) if raw else {}


def identity_config(idp: IdentityServer, extra: str = "", *, fingerprints: bool = False) -> str:
    """kioskauthd.conf for a daemon that uses `idp`: quick retries and a short request timeout."""
    config = FAST_HASH_CONFIG + ("" if fingerprints else "\n[Fingerprint]\nEnabled=no\n") + f"""
[IdentityProvider]
Issuer={idp.issuer}
ClientID={idp.info['client_id']}
ClientSecretCredential=idp-client-secret
AllowedEmailDomains=clinic.example
RequestTimeoutSec=2
RefreshInitialBackoffSec=1
RefreshMaximumBackoffSec=2
CircuitBreakerThreshold=1000
"""
    # `extra` continues the [IdentityProvider] section unless it opens another.
    return config + extra


class TestClock:
    """The KIOSKAUTH_TEST_CLOCK_FILE of one daemon: offsets added to its wall and boot clocks."""

    __test__ = False  # not a pytest test class

    def __init__(self, path: Path):
        self.path = path
        self.set(0, 0)

    def set(self, wall: float, boot: float | None = None, boot_id: str | None = None) -> None:
        """Moves the wall clock by `wall` seconds and the boot clock by `boot` (default: the same)."""
        data = {"wallOffsetSeconds": wall, "bootOffsetSeconds": wall if boot is None else boot}
        if boot_id:
            data["bootID"] = boot_id
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)

    def advance(self, seconds: float) -> None:
        """Both clocks move on together (time passes)."""
        data = json.loads(self.path.read_text())
        self.set(data["wallOffsetSeconds"] + seconds, data["bootOffsetSeconds"] + seconds, data.get("bootID"))


def make_identity_daemon(make_daemon, idp: IdentityServer, extra: str = "", *, fingerprints: bool = False,
                         env: dict | None = None) -> tuple[Daemon, TestClock]:
    """A daemon configured for `idp`, with the client secret as a credential and a test clock."""
    d = make_daemon(config=identity_config(idp, extra, fingerprints=fingerprints))
    credentials = d.root / "idp-credentials"
    credentials.mkdir(mode=0o700)
    (credentials / "idp-client-secret").write_text(idp.info["client_secret"] + "\n")
    clock = TestClock(d.root / "clock.json")
    d.extra_env.update({"CREDENTIALS_DIRECTORY": str(credentials), "KIOSKAUTH_TEST_CLOCK_FILE": str(clock.path), "TZ": "UTC"})
    d.extra_env.update(env or {})
    return d, clock


class Connection:
    """One varlink connection kept open (tickets are bound to it)."""

    def __init__(self, socket_path: str, timeout: float = 30.0):
        self.sock = connect(socket_path, timeout=timeout)

    def call(self, method: str, parameters: dict | None = None) -> dict:
        request = {"method": "io.kioskauth." + method}
        if parameters is not None:
            request["parameters"] = parameters
        send_message(self.sock, request)
        reply = read_message(self.sock)
        assert reply is not None, f"{method}: the daemon closed the connection"
        return reply

    def close(self) -> None:
        self.sock.close()


def ok(reply: dict) -> dict:
    """The parameters of a successful reply (fails the test on an error reply)."""
    assert "error" not in reply, reply
    return reply.get("parameters", {})


def error_name(reply: dict) -> str | None:
    name = reply.get("error")
    return name.rsplit(".", 1)[-1] if name else None


def login(d: Daemon, email: str = SARAH[0], password: str = SARAH[1], conn: Connection | None = None) -> dict:
    own = conn or Connection(d.socket)
    try:
        return own.call("LoginWithPassword", {"email": email, "password": password})
    finally:
        if conn is None:
            own.close()


def person(d: Daemon, name: str = SARAH[0]) -> dict:
    return ok(d.call("io.kioskauth.GetPerson", {"name": name}))["person"]


def wait_until(predicate, timeout: float, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


def audit_events(d: Daemon) -> list[dict]:
    return json.loads(d.ctl("audit", "--json").stdout)["events"]


def set_passcode(d: Daemon, name: str, code: str = "482913") -> None:
    r = d.ctl("passcode", "set", name, input=f"{code}\n{code}\n")
    assert r.returncode == 0, r.stderr


def enroll_with_ticket(conn: Connection, sensor, name: str, ticket: str, finger_id: str) -> dict:
    """Enrols a finger on a virtual storage reader with a login's ticket, touching when asked."""
    from fprint_virtual import VirtualDevice

    send_message(conn.sock, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name, "ticket": ticket}, "more": True})
    while True:
        reply = read_message(conn.sock)
        progress = (reply.get("parameters") or {}).get("progress")
        if "error" in reply or progress is None:
            return reply
        waits = (progress.get("hint") == "touch the reader to check this finger is not already enrolled"
                 if progress["state"] == "duplicate-check" else progress.get("stage", 0) < progress.get("stages", 1))
        if waits:
            VirtualDevice(sensor).scan(finger_id)


def scan_call(conn: Connection, sensor, method: str, parameters: dict, finger_id: str) -> dict:
    """A VerifyFinger or Identify call that touches the virtual reader when it asks."""
    from fprint_virtual import VirtualDevice

    send_message(conn.sock, {"method": "io.kioskauth." + method, "parameters": parameters, "more": True})
    while True:
        reply = read_message(conn.sock)
        if not reply.get("continues"):
            return reply
        VirtualDevice(sensor).scan(finger_id)


PLAIN_SERVER = Path(__file__).resolve().parent / "idp" / "plain_server.py"


def have_plain_provider(provider: str) -> bool:
    try:
        if provider == "dot":
            import oauth2_provider  # noqa: F401
        else:
            import oidc_provider  # noqa: F401
    except ImportError:
        return False
    return True


class PlainProvider:
    """An unmodified provider from PyPI (tests/idp/plain_server.py): `dot` or `oidc-provider`.

    Users are `(email, password, groups)`; `admin()` does what the provider's administrator
    would do through its admin site (revoke a user's tokens, disable a user, change groups)."""

    def __init__(self, provider: str, *, users, access_seconds=300, refresh_seconds=3600, publish_groups=False):
        self.provider = provider
        self.state_dir = Path(tempfile.mkdtemp(prefix="kioskauth-plain-idp-"))
        self.args = ["--provider", provider, "--state-dir", str(self.state_dir),
                     "--access-token-seconds", str(access_seconds), "--refresh-token-seconds", str(refresh_seconds)]
        if publish_groups:
            self.args.append("--publish-groups")
        for email, password, groups in users:
            self.args += ["--user", f"{email}:{password}:{','.join(groups)}"]
        self._launch(0, [])

    def _launch(self, port: int, extra: list[str]) -> None:
        cmd = [sys.executable, str(PLAIN_SERVER), "--port", str(port), *self.args, *extra]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.provider} did not start (exit {self.proc.poll()})")
        self.info = json.loads(line)

    def restart(self, *extra: str) -> None:
        """Stops the provider and starts it again on the same port with the same database (its
        users and tokens), with `extra` command-line settings: an administrator's reconfiguration."""
        self.proc.stdin.close()
        self.proc.wait(10)
        self._launch(self.info["port"], list(extra))

    @property
    def issuer(self) -> str:
        return self.info["issuer"]

    def admin(self, action: str, **fields) -> None:
        self.proc.stdin.write(json.dumps({"action": action, **fields}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert answer["ok"], answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def plain_config(idp: PlainProvider, extra: str = "", *, fingerprints: bool = False,
                 domains: str = "example.com") -> str:
    """kioskauthd.conf for an unmodified provider: a public client, discovery, and the
    revocation endpoint where discovery lacks one (DOT's OIDC discovery does not list it)."""
    revocation = idp.info.get("revocation_endpoint")
    config = FAST_HASH_CONFIG + ("" if fingerprints else "\n[Fingerprint]\nEnabled=no\n") + f"""
[IdentityProvider]
Issuer={idp.issuer}
ClientID={idp.info['client_id']}
AllowedEmailDomains={domains}
RequestTimeoutSec=5
RefreshInitialBackoffSec=1
RefreshMaximumBackoffSec=2
CircuitBreakerThreshold=1000
"""
    if revocation:
        config += f"RevocationEndpoint={revocation}\n"
    return config + extra


def make_plain_daemon(make_daemon, idp: PlainProvider, extra: str = "", *, fingerprints: bool = False,
                      env: dict | None = None) -> tuple[Daemon, TestClock]:
    d = make_daemon(config=plain_config(idp, extra, fingerprints=fingerprints))
    clock = TestClock(d.root / "clock.json")
    d.extra_env.update({"KIOSKAUTH_TEST_CLOCK_FILE": str(clock.path), "TZ": "UTC"})
    d.extra_env.update(env or {})
    return d, clock
