"""Test support: start the real kioskauthd with temporary directories and talk to it.

Everything here drives the real binaries (built by `swift build`), the real socket, and the
real SQLite store; nothing is faked. The binary directory comes from $KIOSKAUTH_BIN_DIR
(default: .build/debug in the repository).
"""

from __future__ import annotations

import json
import os
import pwd
import grp
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("KIOSKAUTH_BIN_DIR", REPO / ".build" / "debug"))
KIOSKAUTHD = BIN_DIR / "kioskauthd"
KIOSKAUTHCTL = BIN_DIR / "kioskauthctl"
RAW_CLIENT = Path(__file__).resolve().parent / "varlink_raw.py"

# Cheap Argon2id so tests that verify many passcodes stay fast; one test checks the defaults.
FAST_HASH_CONFIG = """
[Store]
PasscodeHashMemoryKiB=1024
PasscodeHashIterations=1
"""

# Argon2id slow enough (about 1.5 s a hash here) that a test can kill the daemon mid-check.
SLOW_HASH_CONFIG = """
[Store]
PasscodeHashMemoryKiB=65536
PasscodeHashIterations=40
"""


def start_check(d, name: str, passcode: str) -> socket.socket:
    """Sends a passcode check for `name` and returns its connection once the attempt is counted
    (the hash is being checked); read the answer from it, or kill the daemon."""
    before = d.call("io.kioskauth.GetPerson", {"name": name})["parameters"]["person"]["passcodeFailures"]
    s = connect(d.socket)
    send_message(s, {"method": "io.kioskauth.VerifyPasscode", "parameters": {"name": name, "passcode": passcode}})
    deadline = time.monotonic() + 30
    while d.call("io.kioskauth.GetPerson", {"name": name})["parameters"]["person"]["passcodeFailures"] == before:
        assert time.monotonic() < deadline, "the attempt was never counted"
        time.sleep(0.02)
    return s


def still_checking(s: socket.socket) -> bool:
    """Whether the check sent on `s` (start_check) has not been answered yet."""
    timeout = s.gettimeout()
    s.setblocking(False)
    try:
        s.recv(1, socket.MSG_PEEK)
        return False  # an answer (or the end of the connection) is waiting
    except BlockingIOError:
        return True
    finally:
        s.settimeout(timeout)


def kill_mid_check(d, name: str, passcode: str) -> None:
    """Sends a passcode check for `name` and kills the daemon (SIGKILL) while its hash is being
    checked: once the attempt is counted, before the answer."""
    with start_check(d, name, passcode) as s:
        d.kill()
        assert read_message(s) is None, "the check ended before the kill: the test proves nothing"


class NotifyListener:
    """A datagram NOTIFY_SOCKET, as systemd provides, collecting what the daemon sends."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o777)  # as systemd's: a daemon run as another user can send to it
        self.messages: list[tuple[float, str]] = []

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in m for _, m in self.messages):
                return True
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                break
            self.messages.append((time.monotonic(), data.decode()))
        return any(text in m for _, m in self.messages)

    def drain(self, duration: float) -> None:
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def close(self) -> None:
        self.sock.close()


def _accessible_tempdir(prefix: str) -> Path:
    """A directory other local users (e.g. nobody) can traverse, so they can reach the socket."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


class Daemon:
    """One kioskauthd with its own state, runtime and (optionally) credentials directories."""

    def __init__(self, config: str = FAST_HASH_CONFIG, credential_key: bytes | None = None, env: dict | None = None):
        self.root = _accessible_tempdir("kioskauth-test-")
        self.state = self.root / "state"
        self.runtime = self.root / "run"
        self.config_path = self.root / "kioskauthd.conf"
        self.config_path.write_text(config)
        self.credentials = None
        if credential_key is not None:
            self.credentials = self.root / "credentials"
            self.credentials.mkdir(mode=0o700)
            key_path = self.credentials / "kioskauth.store-key"
            key_path.write_bytes(credential_key)
            key_path.chmod(0o400)
        self.extra_env = env or {}
        # Extra command-line options, and a prefix (e.g. setpriv) to run the daemon under.
        self.extra_args: list[str] = []
        self.prefix: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.notify: NotifyListener | None = None
        self.log_path = self.root / "daemon.log"

    @property
    def socket(self) -> str:
        return str(self.runtime / "io.kioskauth")

    def command(self) -> list[str]:
        cmd = [str(KIOSKAUTHD), "--config", str(self.config_path), "--state-directory", str(self.state),
               "--runtime-directory", str(self.runtime)]
        if self.credentials is None:
            cmd.append("--development-key-file")
        return self.prefix + cmd + self.extra_args

    def environment(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "CREDENTIALS_DIRECTORY", "WATCHDOG_USEC")}
        if self.credentials is not None:
            env["CREDENTIALS_DIRECTORY"] = str(self.credentials)
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 30.0, expect_ready: bool = True) -> "Daemon":
        notify_path = self.root / f"notify-{time.monotonic_ns()}"
        self.notify = NotifyListener(notify_path)
        env = self.environment()
        env["NOTIFY_SOCKET"] = str(notify_path)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if expect_ready:
            if not self.notify.wait_for("READY=1", timeout):
                self.kill()
                raise RuntimeError(f"kioskauthd did not become ready:\n{self.log_text()}")
            (self.runtime).chmod(0o755)
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> "Daemon":
        self.stop()
        return self.start()

    def close(self) -> None:
        self.kill()
        if self.notify:
            self.notify.close()

    # Clients -------------------------------------------------------------------------------

    def ctl(self, *args: str, input: str | None = None, user: str | None = None, groups: list[str] | None = None,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        # --socket is an option of the subcommands, so it goes after them.
        cmd = [str(KIOSKAUTHCTL), *args, "--socket", self.socket]
        return subprocess.run(as_user(cmd, user, groups), input=input, capture_output=True, text=True, timeout=timeout)

    def call(self, method: str, parameters: dict | None = None, user: str | None = None,
             groups: list[str] | None = None) -> dict:
        """One call through the raw client; returns the reply object (with 'error' on failure)."""
        return raw_call(self.socket, method, parameters, user=user, groups=groups)


def as_user(cmd: list[str], user: str | None, groups: list[str] | None = None,
            options: list[str] | None = None) -> list[str]:
    """Runs `cmd` as another Unix user (with exactly `groups` as supplementary groups) via setpriv,
    with setpriv's `options` more (capabilities, say)."""
    if user is None:
        return cmd
    entry = pwd.getpwnam(user)
    group_ids = [str(grp.getgrnam(g).gr_gid) for g in (groups or [])]
    prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}"]
    prefix += [f"--groups={','.join(group_ids)}"] if group_ids else ["--clear-groups"]
    return prefix + (options or []) + ["--"] + cmd


def raw_call(socket_path: str, method: str, parameters: dict | None = None, more: bool = False,
             user: str | None = None, groups: list[str] | None = None, timeout: float = 30.0) -> dict:
    request = {"method": method}
    if parameters is not None:
        request["parameters"] = parameters
    if more:
        request["more"] = True
    cmd = as_user([sys.executable, str(RAW_CLIENT), socket_path], user, groups)
    result = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"raw client failed: {result.stderr}")
    replies = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return replies[-1] if replies else {}


def connect(socket_path: str, timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(socket_path)
    return s


def send_message(s: socket.socket, obj) -> None:
    s.sendall(json.dumps(obj).encode() + b"\0")


_pending: dict[int, bytes] = {}


def read_message(s: socket.socket) -> dict | None:
    """Reads one NUL-terminated reply, keeping bytes of the next ones for later calls (replies to
    pipelined calls can arrive in one read); None when the server closed the connection first."""
    buf = _pending.pop(id(s), b"")
    while b"\0" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk
    message, rest = buf.split(b"\0", 1)
    if rest:
        _pending[id(s)] = rest
    return json.loads(message)


def ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", name], check=True)
        return grp.getgrnam(name).gr_gid
