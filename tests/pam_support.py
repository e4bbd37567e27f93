"""Test support for pam_kioskauth.so: the real module in real libpam, two ways.

- `pamtester` under pam_wrapper (LD_PRELOAD=libpam_wrapper.so, PAM_WRAPPER=1,
  PAM_WRAPPER_SERVICE_DIR=<a private directory>), always under `timeout`;
- a second client, this file run as a program: libpam through ctypes with pam_start_confdir(),
  which can start with no user at all and reads PAM_USER back. It prints every conversation
  message and every result as a JSON line and reads prompt answers from stdin.

Both run as separate processes, so a hang is killed by `timeout` and never takes pytest with it.
The module under test is $PAM_KIOSKAUTH_MODULE (default pam/pam_kioskauth.so, built on demand);
$KIOSKAUTH_PAM_PRELOAD names libraries to preload first (libasan for `make -C pam asan`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULE = Path(os.environ.get("PAM_KIOSKAUTH_MODULE", REPO / "pam" / "pam_kioskauth.so")).resolve()
PRELOAD = os.environ.get("KIOSKAUTH_PAM_PRELOAD", "").split()
STDBUF = Path("/usr/libexec/coreutils/libstdbuf.so")

# PAM return codes (security/_pam_types.h).
PAM_SUCCESS = 0
PAM_PERM_DENIED = 6
PAM_AUTH_ERR = 7
PAM_AUTHINFO_UNAVAIL = 9
PAM_USER_UNKNOWN = 10
PAM_MAXTRIES = 11
PAM_SESSION_ERR = 14
PAM_AUTHTOK_ERR = 20
PAM_CONV_ERR = 19
PAM_IGNORE = 25

# Items (pam_set_item).
ITEMS = {"tty": 3, "rhost": 4, "ruser": 8}
PAM_USER_ITEM = 2
PAM_ACCT_EXPIRED = 13
# What the module exports with pam_putenv() after a successful auth (the role and name) and
# open_session (the session); the client reports them.
ENVIRONMENT = ("KIOSKAUTH_ROLE", "KIOSKAUTH_DISPLAY_NAME", "KIOSKAUTH_SESSION")

_libpam = ctypes.CDLL("libpam.so.0")
_libpam.pam_strerror.restype = ctypes.c_char_p
_libpam.pam_strerror.argtypes = [ctypes.c_void_p, ctypes.c_int]


def strerror(code: int) -> str:
    return _libpam.pam_strerror(None, code).decode()


def module_build() -> Path:
    """Builds pam/pam_kioskauth.so unless a module was named in the environment."""
    if "PAM_KIOSKAUTH_MODULE" not in os.environ:
        subprocess.run(["make", "-s", "-C", str(REPO / "pam"), "pam_kioskauth.so"], check=True, timeout=120)
    assert MODULE.exists(), MODULE
    return MODULE


def security_dir() -> Path:
    """Where libpam's own modules are (pam_unix.so, pam_deny.so, pam_permit.so)."""
    for candidate in ("/lib/x86_64-linux-gnu/security", "/usr/lib/x86_64-linux-gnu/security", "/lib/security",
                      "/usr/lib/security", "/usr/lib64/security"):
        if (Path(candidate) / "pam_permit.so").exists():
            return Path(candidate)
    raise RuntimeError("libpam's module directory not found")


class PamConfig:
    """A private PAM configuration directory, for pam_wrapper and pam_start_confdir alike."""

    def __init__(self, root: Path):
        self.dir = root / "pam.d"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.add("other", "auth required pam_deny.so\naccount required pam_deny.so\n"
                          "password required pam_deny.so\nsession required pam_deny.so\n")

    def add(self, service: str, text: str) -> str:
        (self.dir / service).write_text(text)
        return service

    def kioskauth(self, service: str, socket_path: str, options: str = "", extra: str = "") -> str:
        """A service whose every stack is the module alone, plus `extra` lines."""
        line = f"{MODULE} socket={socket_path} {options}".strip()
        return self.add(service, f"auth required {line}\n{extra}account required {line}\n"
                                 f"password required {line}\nsession required {line}\n")

    def shipped(self, service: str, path: Path, socket_path: str) -> str:
        """A shipped stack with the module's absolute path and the test daemon's socket."""
        text = re.sub(r"(?m)(\s)pam_kioskauth\.so\b", lambda m: f"{m.group(1)}{MODULE} socket={socket_path}",
                      path.read_text())
        return self.add(service, text)


def preload_env(libraries: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAM_WRAPPER", "LD_PRELOAD", "_STDBUF"))}
    preload = PRELOAD + libraries
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    if PRELOAD:
        # Python leaks by design at exit; pamtester (Pamtester) turns leak detection on.
        env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:exitcode=86"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    return env


class Conversation:
    """A running PAM client: collects its output as it comes and answers its prompts."""

    def __init__(self, cmd: list[str], env: dict):
        self.cmd = cmd
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)
        self.out = ""
        self.err = ""
        self.transcript = ""
        self.cursors = {"out": 0, "err": 0}
        self.ended: float | None = None
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, "out"), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, "err"), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, name: str) -> None:
        while True:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            text = chunk.decode(errors="replace")
            with self._changed:
                setattr(self, name, getattr(self, name) + text)
                self.transcript += text
                self._changed.notify_all()

    def expect(self, text: str, stream: str = "out", timeout: float = 20.0) -> None:
        """Waits until `text` appears on `stream` ("out" or "err") after what earlier
        expectations on that stream consumed. Each stream keeps its own order; the two are not
        ordered against each other."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                seen = getattr(self, stream)
                index = seen.find(text, self.cursors[stream])
                if index >= 0:
                    self.cursors[stream] = index + len(text)
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not any(r.is_alive() for r in self._readers)):
                    raise AssertionError(f"{text!r} not seen on std{stream}; transcript:\n{self.transcript}")
                self._changed.wait(min(remaining, 0.1))

    def send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def close_input(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def wait(self, timeout: float = 60.0) -> int:
        self.close_input()
        code = self.proc.wait(timeout=timeout)
        self.ended = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=5)
        if PRELOAD:
            assert "Sanitizer" not in self.err, self.err
            assert code not in (86, 87), self.err
        return code

    def interrupt(self, attempts: int = 10, every: float = 0.5) -> None:
        """Ctrl-C, as a person presses it: again while nothing happened. The module ends a wait
        when a signal interrupts it; one that lands in the instant before the module starts
        waiting (after the prompt is shown, on a loaded machine) reaches only the
        application's handler, as it would for any blocking call."""
        for _ in range(attempts):
            # To the client itself as well as to `timeout` in front of it: timeout forwards the
            # signal, but not when it lands while timeout is between its own steps.
            self.proc.send_signal(signal.SIGINT)
            for child in self._children():
                try:
                    os.kill(child, signal.SIGINT)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + every
            while time.monotonic() < deadline:
                if self.proc.poll() is not None or any(e["event"] == "result" for e in self.events()):
                    return
                time.sleep(0.02)

    def _children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class Pamtester(Conversation):
    """pamtester under pam_wrapper: `pamtester SERVICE USER OP...` with -I items."""

    def __init__(self, config: PamConfig, service: str, user: str, *ops: str, items: dict | None = None,
                 timeout: float = 60.0, extra_env: dict | None = None):
        inner = preload_env(["libpam_wrapper.so", str(STDBUF)])
        wrapper = {"LD_PRELOAD": inner.pop("LD_PRELOAD"), "PAM_WRAPPER": "1",
                   "PAM_WRAPPER_SERVICE_DIR": str(config.dir), "_STDBUF_O": "L", **(extra_env or {})}
        if PRELOAD:
            wrapper["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=86"
        # timeout and env start before the preload applies: only pamtester carries pam_wrapper.
        cmd = ["timeout", "-k", "5", str(timeout), "env", *(f"{k}={v}" for k, v in wrapper.items()), "pamtester"]
        for key, value in (items or {}).items():
            cmd += ["-I", f"{key}={value}"]
        cmd += [service, user, *ops]
        super().__init__(cmd, inner)

    def result(self, timeout: float = 60.0) -> int:
        """The PAM code of the operation that ended the run (PAM_SUCCESS when all succeeded)."""
        code = self.wait(timeout)
        assert code != 124, f"pamtester timed out:\n{self.transcript}"
        if code == 0:
            return PAM_SUCCESS
        # (after a prompt the message shares its line)
        messages = re.findall(r"(?m)pamtester: (.*)$", self.err)
        assert messages, self.transcript
        message = messages[-1]
        for candidate in range(0, 40):
            if strerror(candidate) == message:
                return candidate
        raise AssertionError(f"unknown pamtester message {message!r}")


class Client(Conversation):
    """The ctypes client (this file as a program) with pam_start_confdir."""

    def __init__(self, config: PamConfig, service: str, user: str | None, *ops: str, items: dict | None = None,
                 timeout: float = 60.0, run_as: list[str] | None = None, python: str = sys.executable):
        """`run_as`: a command prefix that runs the client as another user (setpriv ... --), with
        a `python` that user can run."""
        env = preload_env([])
        cmd = ["timeout", "-k", "5", str(timeout), *(run_as or []), python, str(Path(__file__).resolve()),
               "--confdir", str(config.dir), "--service", service]
        if user is not None:
            cmd += ["--user", user]
        for key, value in (items or {}).items():
            cmd += ["--item", f"{key}={value}"]
        super().__init__(cmd + list(ops), env)

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]

    def results(self, timeout: float = 60.0) -> list[dict]:
        code = self.wait(timeout)
        assert code == 0, f"client failed ({code}):\n{self.transcript}"
        return [e for e in self.events() if e["event"] == "result"]

    def expect_message(self, text: str, timeout: float = 20.0) -> None:
        """Waits for a conversation message with exactly this text (as the JSON line encodes it)."""
        self.expect(json.dumps(text), timeout=timeout)

    def messages(self) -> list[tuple[str, str]]:
        return [(e["style"], e["text"]) for e in self.events() if e["event"] == "message"]

    def transcript_lines(self) -> list[str]:
        """The conversation as a terminal shows it: prompts with what was typed at echo-on prompts
        (never what was typed at echo-off ones), info lines, error lines marked "! ", and each
        operation's result."""
        lines = []
        for e in self.events():
            if e["event"] == "message":
                lines.append(("! " if e["style"] == "error" else "") + e["text"])
            elif e["event"] == "answer" and lines:
                lines[-1] += e["text"]
            elif e["event"] == "result":
                lines.append(f"[{e['op']}: {strerror(e['rc'])}; PAM_USER={e['user']}; env={e.get('env')}]")
        return lines


def run_pamtester(config: PamConfig, service: str, user: str, *ops: str, answers: list[tuple[str, str]] = (),
                  items: dict | None = None, timeout: float = 60.0) -> Pamtester:
    """Runs pamtester, answering each expected prompt in turn; returns it finished."""
    p = Pamtester(config, service, user, *ops, items=items, timeout=timeout)
    for prompt, answer in answers:
        p.expect(prompt, "err")
        p.send(answer)
    p.wait(timeout + 10)
    return p


# Fingerprints -------------------------------------------------------------------------------------


CHECK_HINT = "touch the reader to check this finger is not already enrolled"


class VarlinkConnection:
    """A varlink connection that keeps what arrives after a message for the next one (two
    streamed replies often come in one read)."""

    def __init__(self, path: str, timeout: float = 60.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.pending = b""

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\0")

    def receive(self) -> dict:
        while b"\0" not in self.pending:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.pending += chunk
        message, self.pending = self.pending.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        self.sock.close()


def enroll(d, sensor: Path, name: str, finger_id: str, *, finger: str | None = None,
           reader: str | None = None) -> dict:
    """Enrols a finger over the socket (on `reader`, an id, when given), touching the virtual
    reader at `sensor` whenever it waits for one."""
    from fprint_virtual import scan

    parameters = {"name": name}
    if finger:
        parameters["finger"] = finger
    if reader:
        parameters["reader"] = reader
    connection = VarlinkConnection(d.socket)
    connection.send({"method": "io.kioskauth.EnrollFinger", "parameters": parameters, "more": True})
    try:
        while True:
            reply = connection.receive()
            progress = (reply.get("parameters") or {}).get("progress")
            if "error" in reply or progress is None:
                assert "error" not in reply, reply
                return reply
            if progress["state"] == "duplicate-check":
                if progress.get("hint") == CHECK_HINT:
                    scan(sensor, finger_id)
            elif progress.get("stage", 0) < progress.get("stages", 1):
                scan(sensor, finger_id)
    finally:
        connection.close()


def stale_socket(path: Path) -> Path:
    """A socket file nobody listens on (what a crashed daemon leaves behind)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return path


# The ctypes client ----------------------------------------------------------------------------------


class _Message(ctypes.Structure):
    _fields_ = [("msg_style", ctypes.c_int), ("msg", ctypes.c_char_p)]


class _Response(ctypes.Structure):
    _fields_ = [("resp", ctypes.c_void_p), ("resp_retcode", ctypes.c_int)]


_CONV = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.POINTER(_Message)),
                         ctypes.POINTER(ctypes.POINTER(_Response)), ctypes.c_void_p)


class _Conv(ctypes.Structure):
    _fields_ = [("conv", _CONV), ("appdata_ptr", ctypes.c_void_p)]


STYLES = {1: "prompt_echo_off", 2: "prompt_echo_on", 3: "error", 4: "info"}
OPERATIONS = {"authenticate": "pam_authenticate", "acct_mgmt": "pam_acct_mgmt", "chauthtok": "pam_chauthtok",
              "open_session": "pam_open_session", "close_session": "pam_close_session"}


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def client_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Runs PAM operations through libpam with pam_start_confdir.")
    parser.add_argument("--confdir", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--user", default=None, help="PAM_USER at pam_start (none: NULL)")
    parser.add_argument("--item", action="append", default=[], help="tty=..., rhost=..., ruser=...")
    parser.add_argument("operations", nargs="+", choices=sorted([*OPERATIONS, "pause", "set_user", "reuse_fds"]),
                        help="pause: report {'event': 'paused'} and wait for a line on stdin; "
                             "set_user: read a line from stdin and make it PAM_USER (as a later "
                             "module in a stack could); reuse_fds: put /dev/null on the number of "
                             "every socket this process has open (as an application that closes "
                             "descriptors and opens others could), and report those numbers")
    args = parser.parse_args(argv)

    libc = ctypes.CDLL(None)
    libc.calloc.restype = ctypes.c_void_p
    libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.strdup.restype = ctypes.c_void_p
    libc.strdup.argtypes = [ctypes.c_char_p]
    pam = ctypes.CDLL("libpam.so.0")

    def conversation(count, messages, responses, _appdata):
        replies = libc.calloc(count, ctypes.sizeof(_Response))
        if not replies:
            return 5  # PAM_BUF_ERR
        array = ctypes.cast(replies, ctypes.POINTER(_Response))
        for i in range(count):
            message = messages[i].contents
            style = STYLES.get(message.msg_style, str(message.msg_style))
            _emit({"event": "message", "style": style, "text": (message.msg or b"").decode(errors="replace")})
            if style.startswith("prompt"):
                line = sys.stdin.readline()
                if not line:
                    _emit({"event": "conversation-ended"})
                    for j in range(i):
                        if array[j].resp:
                            libc.free(ctypes.c_void_p(array[j].resp))
                    libc.free(ctypes.c_void_p(replies))
                    return PAM_CONV_ERR
                answer = line.rstrip("\n")
                if style == "prompt_echo_on":
                    _emit({"event": "answer", "text": answer})
                array[i].resp = libc.strdup(answer.encode())
        responses[0] = array
        return PAM_SUCCESS

    callback = _CONV(conversation)
    conv = _Conv(callback, None)
    handle = ctypes.c_void_p()
    pam.pam_start_confdir.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_Conv), ctypes.c_char_p,
                                      ctypes.POINTER(ctypes.c_void_p)]
    rc = pam.pam_start_confdir(args.service.encode(), args.user.encode() if args.user is not None else None,
                               ctypes.byref(conv), args.confdir.encode(), ctypes.byref(handle))
    if rc != PAM_SUCCESS:
        _emit({"event": "result", "op": "start", "rc": rc})
        return 0
    pam.pam_set_item.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    for item in args.item:
        key, value = item.split("=", 1)
        pam.pam_set_item(handle, ITEMS[key], value.encode())

    # A signal must interrupt the module's wait, not kill this process or raise in Python. The
    # handler writes with os.write: one landing while _emit writes a result would otherwise make
    # a reentrant call into sys.stdout, which raises and loses the result.
    signal.signal(signal.SIGINT, lambda *_: os.write(1, b'{"event": "signal", "signal": "SIGINT"}\n'))

    pam.pam_get_item.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    pam.pam_getenv.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    pam.pam_getenv.restype = ctypes.c_char_p
    status = PAM_SUCCESS
    for op in args.operations:
        if op == "pause":
            _emit({"event": "paused"})
            sys.stdin.readline()
            continue
        if op == "set_user":
            pam.pam_set_item(handle, PAM_USER_ITEM, sys.stdin.readline().rstrip("\n").encode())
            continue
        if op == "reuse_fds":
            import stat as stat_module
            replaced = []
            null = os.open("/dev/null", os.O_RDWR)
            for fd in range(3, 1024):
                try:
                    if fd != null and stat_module.S_ISSOCK(os.fstat(fd).st_mode):
                        os.dup2(null, fd)
                        replaced.append(fd)
                except OSError:
                    pass
            os.close(null)
            _emit({"event": "reused", "fds": replaced})
            continue
        function = getattr(pam, OPERATIONS[op])
        function.argtypes = [ctypes.c_void_p, ctypes.c_int]
        started = time.monotonic()
        status = function(handle, 0)
        elapsed = time.monotonic() - started
        user = ctypes.c_char_p()
        pam.pam_get_item(handle, PAM_USER_ITEM, ctypes.byref(user))
        env = {}
        for name in ENVIRONMENT:
            value = pam.pam_getenv(handle, name.encode())
            if value is not None:
                env[name] = value.decode(errors="replace")
        _emit({"event": "result", "op": op, "rc": status, "user": user.value.decode() if user.value else user.value,
               "seconds": elapsed, "env": env})
        if status != PAM_SUCCESS:
            break
    pam.pam_end.argtypes = [ctypes.c_void_p, ctypes.c_int]
    pam.pam_end(handle, status)
    still_open = []
    for event_fd in range(3, 1024):
        try:
            os.fstat(event_fd)
            still_open.append(event_fd)
        except OSError:
            pass
    _emit({"event": "ended", "open_fds": still_open})
    return 0


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
