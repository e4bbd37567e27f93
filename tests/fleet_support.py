"""Fleet test support: a real PostgreSQL directory, a cuttable TCP path to it, and several real
kioskauthd terminals joined into one fleet (docs/fleet.md).

* `Postgres` runs PostgreSQL 15 from `initdb` in a temporary directory (as `nobody` when the
  tests run as root, since PostgreSQL refuses root), listening on 127.0.0.1 at a free port and on
  a Unix socket in that directory. It creates the role `kiosk` (with a password, required over
  TCP by scram-sha-256) and the database `fleet`, and is always stopped at the end.
* `Proxy` is a TCP relay in front of it, one per terminal, so that one terminal can be cut off
  (existing connections dropped, new ones refused), stalled (its requests reach the server but
  the answers are held back) and restored, while the others stay connected.
* `Terminal` is a real kioskauthd with its own state, runtime and credentials directories
  (`kioskauth.store-key`, `kioskauth.fleet-key` from `kioskauthctl fleet keygen`,
  `kioskauth.fleet-password`) and its own libfprint virtual reader.
* `Fleet` starts all of that, creates the fleet on the first terminal and joins the others.

Everything is real: the daemons, PostgreSQL, the sockets. Waits are on conditions with
generous deadlines, never on a fixed sleep.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import select
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from fprint_virtual import PrintImage, VirtualDevice, VirtualImage, environment, prints_directory
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHCTL, Daemon, connect, read_message, send_message

ROLE = "kiosk"
DATABASE = "fleet"
SUPERUSER = "fleet"
CONDITION_TIMEOUT = 90.0


def pg_bin() -> Path:
    """PostgreSQL's programs: $KIOSKAUTH_PG_BIN, else the newest /usr/lib/postgresql/N/bin."""
    if configured := os.environ.get("KIOSKAUTH_PG_BIN"):
        return Path(configured)
    root = Path("/usr/lib/postgresql")
    versions = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()), reverse=True) if root.exists() else []
    for version in versions:
        if (root / str(version) / "bin/initdb").exists():
            return root / str(version) / "bin"
    raise FileNotFoundError("PostgreSQL is not installed (scripts/install-deps)")


def postgres_available() -> bool:
    try:
        pg_bin()
        return True
    except FileNotFoundError:
        return False


def have_nist_prints() -> bool:
    try:
        prints_directory()
        return True
    except FileNotFoundError:
        return False


def fleet_test_marks() -> list:
    """The skip marks every fleet test module carries: PostgreSQL's programs and kioskauthctl."""
    import pytest

    return [
        pytest.mark.skipif(not postgres_available(), reason="PostgreSQL is not installed (scripts/install-deps)"),
        pytest.mark.skipif(not KIOSKAUTHCTL.exists(), reason="kioskauthctl is not built"),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(parent: int, name: str | None = "kioskauth-fleet", zombies: bool = False) -> list[int]:
    """Processes whose parent is `parent` and, unless `name` is None, whose name is `name`
    (zombies left out unless asked for): a daemon's fleet helper, say."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == parent and name in (None, comm) and (zombies or state != "Z"):
            found.append(int(entry.name))
    return found


def wait_until(condition, timeout: float = CONDITION_TIMEOUT, interval: float = 0.1, what: str = "condition"):
    """Calls `condition` until it returns something truthy (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s (last: {last!r})")
        time.sleep(interval)


class Postgres:
    """A real PostgreSQL server for one test or one bench run."""

    def __init__(self, password: str | None = None):
        self.bin = pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="kioskauth-fleet-pg-"))
        self.user = "nobody" if os.getuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.dir.chmod(0o755)  # the Unix socket is reachable by psql/pg_dump run as root
        self.port = free_port()
        self.password = password if password is not None else secrets.token_urlsafe(18)
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.started = False

    def _run(self, program: str, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
        command = [str(self.bin / program), *args]
        if self.user:
            entry = pwd.getpwnam(self.user)
            command = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *command]
        result = subprocess.run(command, cwd=self.dir, capture_output=True, input=input, timeout=180,
                                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.dir)})
        if check and result.returncode != 0:
            raise RuntimeError(f"{program} failed ({result.returncode}): {result.stderr.decode(errors='replace')}"
                               f"\n{self.log_text()[-3000:]}")
        return result

    def _options(self) -> str:
        return f"-k {self.dir} -h 127.0.0.1 -p {self.port} -c max_connections=100"

    def start(self) -> "Postgres":
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth-local=trust", "--auth-host=scram-sha-256",
                  "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "-o", self._options(), "start")
        self.started = True
        # The directory's owner (docs/fleet.md §6): it migrates, and CREATEROLE lets migration 2
        # create the kioskauth_terminal group. Terminals never log in as it.
        self.sql(f"CREATE ROLE {ROLE} LOGIN CREATEROLE PASSWORD '{self.password}'")
        self.sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        return self

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session is ended, the server comes back on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "-m", "fast",
                  "-o", self._options(), "restart")

    def stop(self) -> None:
        try:
            if self.started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop", check=False)
        finally:
            self.started = False
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Postgres":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    # Reading the directory as its administrator (over the Unix socket, trust) ----------------

    def psql(self, query: str, database: str | None = None) -> str:
        command = [str(self.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-F", "\t",
                   "-h", str(self.dir), "-p", str(self.port), "-U", SUPERUSER, "-d", database or "postgres",
                   "-c", query]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr}")
        return result.stdout

    def sql(self, query: str, database: str | None = None) -> list[list[str]]:
        """Rows of a query as lists of text fields (NULL is the empty string)."""
        out = self.psql(query, database)
        return [line.split("\t") for line in out.splitlines() if line != ""]

    def fleet(self, query: str) -> list[list[str]]:
        """A query in the fleet database."""
        return self.sql(query, DATABASE)

    def scalar(self, query: str) -> str | None:
        rows = self.fleet(query)
        return rows[0][0] if rows else None

    def dump(self) -> bytes:
        """`pg_dump` of the fleet database, as a thief with a backup would have it."""
        command = [str(self.bin / "pg_dump"), "-h", str(self.dir), "-p", str(self.port), "-U", SUPERUSER, DATABASE]
        result = subprocess.run(command, capture_output=True, timeout=180, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        if result.returncode != 0:
            raise RuntimeError(f"pg_dump failed: {result.stderr.decode(errors='replace')}")
        return result.stdout


class Proxy:
    """A TCP relay from 127.0.0.1:`port` to the directory, which a test can cut and restore."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self._stalled = False
        self._marker: bytes | None = None
        self._held: set[socket.socket] = set()
        self._closed = False
        self.accepted = 0
        self._listen()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener

    def _accept_loop(self) -> None:
        while not self._closed:
            with self._lock:
                listener = self._listener
            if listener is None:
                time.sleep(0.05)
                continue
            try:
                ready, _, _ = select.select([listener], [], [], 0.1)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is None:  # cut while connecting
                    client.close()
                    server.close()
                    continue
                self._pairs.append((client, server))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while not self._closed:
                # While stalled the server's answers stay unread (held back in the kernel).
                stalled = self._stalled or client in self._held
                watch = [client] if stalled else [client, server]
                ready, _, _ = select.select(watch, [], [], 0.1)
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    if source is client:
                        server.sendall(data)
                        marker = self._marker
                        if marker is not None and marker in data:
                            with self._lock:
                                self._held.add(client)
                    else:
                        client.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            self._drop(client, server)

    def _drop(self, client: socket.socket, server: socket.socket) -> None:
        with self._lock:
            if (client, server) in self._pairs:
                self._pairs.remove((client, server))
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """The network to the directory goes away: connections dropped, new ones refused."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs = list(self._pairs)
        if listener is not None:
            listener.close()
            # The accept thread may still hold the socket in select() for up to 0.1 s; after
            # this, connecting is refused.
            time.sleep(0.25)
        for client, server in pairs:
            self._drop(client, server)

    def stall(self) -> None:
        """Requests still reach the directory, but its answers are held back (a lost reply)."""
        self._stalled = True

    def stall_after(self, marker: bytes) -> None:
        """Like `stall`, but only for a connection once a request containing `marker` (e.g. the
        name of the function a push calls) went through it: that request is applied, its answer
        and everything after it on that connection is held back. Other traffic flows."""
        self._marker = marker

    def restore(self) -> None:
        """Back to normal: held answers are dropped with their connections, new ones accepted."""
        if self._stalled or self._marker is not None:
            self._stalled = False
            self._marker = None
            with self._lock:
                pairs = list(self._pairs)
                self._held.clear()
            for client, server in pairs:
                self._drop(client, server)
        with self._lock:
            cut = self._listener is None
        if cut:
            self._listen()

    def close(self) -> None:
        self._closed = True
        self.cut()


class Client:
    """One persistent connection to a terminal's socket (as root)."""

    def __init__(self, socket_path: str, timeout: float = 60.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.sock = connect(socket_path, timeout=timeout)

    def call(self, method: str, parameters: dict | None = None) -> dict:
        request = {"method": method if "." in method else f"io.kioskauth.{method}"}
        if parameters is not None:
            request["parameters"] = parameters
        try:
            send_message(self.sock, request)
            reply = read_message(self.sock)
        except OSError:
            reply = None
        if reply is None:  # the daemon closed the connection (idle timeout, restart): once more
            self.close()
            self.sock = connect(self.socket_path, timeout=self.timeout)
            send_message(self.sock, request)
            reply = read_message(self.sock)
        return reply

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def error_name(reply: dict) -> str | None:
    error = reply.get("error")
    return error.rsplit(".", 1)[-1] if error else None


def ok(reply: dict) -> dict:
    """The parameters of a successful reply; a clear assertion otherwise."""
    assert "error" not in reply, reply
    return reply.get("parameters", {})


class Terminal(Daemon):
    """A kioskauthd fleet terminal with its own reader, credentials and path to the directory."""

    def __init__(self, name: str, postgres: Postgres, driver: str = "virtual_image", fleet_config: str = "",
                 config: str = ""):
        self.name = name
        self.store_key = os.urandom(32)
        fleet = f"\n[Fleet]\nTerminalName={name}\n{fleet_config}\n"
        super().__init__(config=FAST_HASH_CONFIG + config + fleet, credential_key=self.store_key)
        self.postgres = postgres
        self.proxy = Proxy(postgres.port)
        self.driver = driver
        self.sensor = self.root / "sensor.sock"
        self.extra_env.update(environment(driver, self.sensor, base={}))
        key = self.credentials / "kioskauth.fleet-key"
        result = subprocess.run([str(KIOSKAUTHCTL), "fleet", "keygen", "--output", str(key)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"fleet keygen failed: {result.stderr}"
        self.public_key = result.stdout.strip().split()[-1] if result.stdout.strip() else ""
        # Its own database role (made by Fleet.provision once the schema is migrated), with
        # its own password in its credential.
        self.role = f"kt_{name.lower()}"
        self.role_password = secrets.token_urlsafe(18)
        (self.credentials / "kioskauth.fleet-password").write_text(self.role_password)
        self._client: Client | None = None

    @property
    def url(self) -> str:
        """The directory as this terminal reaches it, as its own role: through its own proxy,
        loopback, no TLS."""
        return f"postgres://{self.role}@127.0.0.1:{self.proxy.port}/{DATABASE}?sslmode=disable"

    @property
    def owner_url(self) -> str:
        """The directory as its owner, for FleetMigrate only (the password goes in the call)."""
        return f"postgres://{ROLE}@127.0.0.1:{self.proxy.port}/{DATABASE}?sslmode=disable"

    def start(self, timeout: float = 60.0, expect_ready: bool = True) -> "Terminal":
        super().start(timeout=timeout, expect_ready=expect_ready)
        if expect_ready:
            wait_for_reader(self.sensor)
        return self

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.socket)
        return self._client

    def rpc(self, method: str, parameters: dict | None = None) -> dict:
        return self.client.call(method, parameters)

    def kill(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        super().kill()

    def stop(self, timeout: float = 20.0) -> int:
        if self._client is not None:
            self._client.close()
            self._client = None
        return super().stop(timeout)

    def close(self) -> None:
        super().close()
        self.proxy.close()

    # The fleet methods ------------------------------------------------------------------------

    def status(self) -> dict:
        return ok(self.rpc("FleetStatus"))

    def sync(self) -> dict:
        return self.rpc("FleetSync")

    def terminal_id(self) -> str:
        return self.status()["terminalId"]

    # People and credentials -------------------------------------------------------------------

    def add_person(self, name: str) -> dict:
        return ok(self.rpc("AddPerson", {"name": name, "displayName": name.title()}))

    def set_passcode(self, name: str, passcode: str) -> dict:
        return ok(self.rpc("SetPasscode", {"name": name, "passcode": passcode, "confirmation": passcode}))

    def verify_passcode(self, name: str, passcode: str) -> dict:
        return self.rpc("VerifyPasscode", {"name": name, "passcode": passcode})

    def person(self, name: str) -> dict:
        return self.rpc("GetPerson", {"name": name})

    def audit(self) -> list[dict]:
        return ok(self.rpc("GetAudit", {"limit": 100000}))["events"]

    def enroll_image(self, name: str, print_name: str, finger: str = "right-index") -> dict:
        """Enrols `name`'s finger with the NIST print `print_name` for every touch."""
        image = PrintImage.load(print_name)
        images = VirtualImage(self.sensor, timeout=60)
        s = connect(self.socket, timeout=120)
        try:
            send_message(s, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name, "finger": finger},
                             "more": True})
            while True:
                reply = read_message(s)
                progress = (reply.get("parameters") or {}).get("progress")
                if "error" in reply or progress is None:
                    return reply
                if wants_touch(progress):
                    images.send_image(image)
        finally:
            images.close()
            s.close()

    def enroll_device(self, name: str, finger_id: str, finger: str = "right-index") -> dict:
        """Enrols on virtual_device(_storage), touching with `finger_id` whenever asked."""
        s = connect(self.socket, timeout=120)
        try:
            send_message(s, {"method": "io.kioskauth.EnrollFinger", "parameters": {"name": name, "finger": finger},
                             "more": True})
            while True:
                reply = read_message(s)
                progress = (reply.get("parameters") or {}).get("progress")
                if "error" in reply or progress is None:
                    return reply
                if wants_touch(progress):
                    VirtualDevice(self.sensor).scan(finger_id)
        finally:
            s.close()

    def identify_image(self, print_name: str) -> dict:
        """One walk-up identify touched with the NIST print `print_name`: the final reply."""
        s = connect(self.socket, timeout=120)
        images = VirtualImage(self.sensor, timeout=60)
        try:
            send_message(s, {"method": "io.kioskauth.Identify", "parameters": {}, "more": True})
            while True:
                reply = read_message(s)
                progress = (reply.get("parameters") or {}).get("progress")
                if not reply.get("continues") or progress is None:
                    return reply
                if progress.get("state") == "touch":
                    images.send_print(print_name)
        finally:
            images.close()
            s.close()

    def verify_device(self, name: str, finger_id: str) -> dict:
        """One VerifyFinger of `name` on virtual_device(_storage), touched with `finger_id`."""
        s = connect(self.socket, timeout=120)
        try:
            send_message(s, {"method": "io.kioskauth.VerifyFinger", "parameters": {"name": name}, "more": True})
            while True:
                reply = read_message(s)
                progress = (reply.get("parameters") or {}).get("progress")
                if not reply.get("continues") or progress is None:
                    return reply
                if progress.get("state") == "touch":
                    VirtualDevice(self.sensor).scan(finger_id)
        finally:
            s.close()

    # The terminal's own store, opened with the store key the test gave it ---------------------

    def stored_secrets(self, name: str) -> dict[str, bytes]:
        """The plaintext of `name`'s sealed secrets in this terminal's SQLite store: the passcode
        verifier ("passcode") and each finger's template ("finger:<finger>"), opened with the
        store key as the daemon does (docs/design.md §4.5)."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"kioskauth store v1", info=b"seal").derive(self.store_key)
        aead = ChaCha20Poly1305(key)

        def open_sealed(sealed: bytes, table: str, column: str, row: str, owner: str) -> bytes:
            assert sealed[0] == 1, "unknown seal format"
            associated = f"kioskauth.seal.v1\0{table}\0{column}\0{row}\0{owner}".encode()
            return aead.decrypt(sealed[1:13], sealed[13:], associated)

        found: dict[str, bytes] = {}
        uri = f"file:{self.state / 'kioskauth.sqlite'}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=30) as db:
            row = db.execute("SELECT id FROM people WHERE name = ?", (name,)).fetchone()
            assert row is not None, f"{name} is not in {self.name}'s store"
            person_id = row[0]
            for kind, sealed in db.execute("SELECT kind, sealed FROM secrets WHERE person_id = ?", (person_id,)):
                found[kind] = open_sealed(bytes(sealed), "secrets", kind, str(person_id), name)
            for finger, sealed in db.execute("SELECT finger, template FROM fingers WHERE person_id = ?", (person_id,)):
                found[f"finger:{finger}"] = open_sealed(bytes(sealed), "fingers", finger, str(person_id), name)
        return found


CHECK_HINT = "touch the reader to check this finger is not already enrolled"


def wants_touch(progress: dict) -> bool:
    """Whether the reader waits for a finger after this enrolment progress report."""
    if progress["state"] == "duplicate-check":
        return progress.get("hint") == CHECK_HINT
    return progress.get("stage", 0) < progress.get("stages", 1)


def wait_for_reader(sensor: Path, timeout: float = 60.0) -> None:
    wait_until(lambda: sensor.exists(), timeout=timeout, interval=0.05, what=f"reader socket {sensor}")


class Fleet:
    """A directory and terminals joined into one fleet; `close` stops everything, even after a
    failure half-way through `start`."""

    def __init__(self, drivers: list[str], fleet_config: str = "", config: str = "",
                 terminal_fleet_config: dict[int, str] | None = None):
        self.postgres = Postgres()
        self.drivers = drivers
        self.fleet_config = fleet_config
        self.config = config
        self.terminal_fleet_config = terminal_fleet_config or {}
        self.terminals: list[Terminal] = []

    def start(self) -> "Fleet":
        try:
            self.postgres.start()
            for index, driver in enumerate(self.drivers):
                fleet_config = self.fleet_config + "\n" + self.terminal_fleet_config.get(index, "")
                self.terminals.append(Terminal(chr(ord("A") + index), self.postgres, driver, fleet_config, self.config))
            # Started side by side: each start waits for READY and its reader, mostly idle.
            failures: list[BaseException] = []

            def start(terminal: Terminal) -> None:
                try:
                    terminal.start()
                except BaseException as error:  # noqa: BLE001 - reported below
                    failures.append(error)

            threads = [threading.Thread(target=start, args=(t,)) for t in self.terminals]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if failures:
                raise failures[0]
            self.form()
        except BaseException:
            self.close()
            raise
        return self

    def form(self) -> None:
        """The owner migrates the directory through the first terminal (which keeps nothing of
        it), each terminal gets a role of its own, the first creates the fleet, and each other
        one joins with a token it issued."""
        first, *others = self.terminals
        migrated = ok(first.rpc("FleetMigrate", {"directory": first.owner_url, "password": self.postgres.password}))
        assert migrated["version"] >= 2, migrated
        for terminal in self.terminals:
            self.provision(terminal)
        created = ok(first.rpc("FleetCreate", {"directory": first.url, "name": first.name}))
        assert created["terminalId"]
        for terminal in others:
            self.join(terminal, issuer=first)

    def provision(self, terminal: Terminal) -> None:
        """The DBA's step for one terminal: its login role, a member of kioskauth_terminal."""
        if self.postgres.fleet(f"SELECT 1 FROM pg_roles WHERE rolname = '{terminal.role}'"):
            return
        self.postgres.fleet(f"SELECT fleet_create_terminal_role('{terminal.role}', '{terminal.role_password}')")

    def join(self, terminal: Terminal, issuer: Terminal) -> None:
        self.provision(terminal)
        token = ok(issuer.rpc("FleetIssueJoinToken", {"validSeconds": 600}))["token"]
        assert token.startswith("kat1."), token
        # Through the CLI, as an admin would: the token on standard input, never in argv.
        joined = terminal.ctl("fleet", "join", terminal.url, "--name", terminal.name, input=token + "\n", timeout=120)
        assert joined.returncode == 0, f"fleet join failed: {joined.stdout}{joined.stderr}"
        self.wait_member(terminal, issuer)

    def wait_member(self, terminal: Terminal, issuer: Terminal, timeout: float = CONDITION_TIMEOUT) -> None:
        def admitted():
            issuer.sync()
            terminal.sync()
            return terminal.status()["state"] == "member"

        wait_until(admitted, timeout=timeout, interval=0.3, what=f"{terminal.name} a member")

    def sync_all(self) -> None:
        for terminal in self.terminals:
            ok(terminal.sync())

    def close(self) -> None:
        for terminal in self.terminals:
            try:
                terminal.close()
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass
        self.postgres.stop()

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, index: int) -> Terminal:
        return self.terminals[index]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hpke_wrap(public_key: bytes, terminal_id: str, generation: int, data_key: bytes) -> tuple[bytes, bytes]:
    """A data key wrapped to a terminal's public key as anyone who can write to the directory
    could wrap it (its public key is there): HPKE base mode, RFC 9180, DHKEM(X25519,
    HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305, with the info and associated data of
    docs/fleet.md §3. Written from the RFC here, independently of the daemon's swift-crypto
    (the `cryptography` package's HPKE takes no associated data). Returns (encapsulated key,
    ciphertext)."""
    from cryptography.hazmat.primitives import hashes, hmac
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    def extract(salt: bytes, ikm: bytes) -> bytes:
        mac = hmac.HMAC(salt or bytes(32), hashes.SHA256())
        mac.update(ikm)
        return mac.finalize()

    def expand(prk: bytes, info: bytes, length: int) -> bytes:
        out, block, counter = b"", b"", 1
        while len(out) < length:
            mac = hmac.HMAC(prk, hashes.SHA256())
            mac.update(block + info + bytes([counter]))
            block = mac.finalize()
            out += block
            counter += 1
        return out[:length]

    def labeled_extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
        return extract(salt, b"HPKE-v1" + suite + label + ikm)

    def labeled_expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
        return expand(prk, length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info, length)

    kem_suite = b"KEM" + (0x0020).to_bytes(2, "big")
    hpke_suite = b"HPKE" + (0x0020).to_bytes(2, "big") + (0x0001).to_bytes(2, "big") + (0x0003).to_bytes(2, "big")
    ephemeral = X25519PrivateKey.generate()
    enc = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    dh = ephemeral.exchange(X25519PublicKey.from_public_bytes(public_key))
    eae_prk = labeled_extract(kem_suite, b"", b"eae_prk", dh)
    shared = labeled_expand(kem_suite, eae_prk, b"shared_secret", enc + public_key, 32)
    info = b"kioskauth.fleet.data-key.v1"
    context = (b"\x00" + labeled_extract(hpke_suite, b"", b"psk_id_hash", b"")
               + labeled_extract(hpke_suite, b"", b"info_hash", info))
    secret = labeled_extract(hpke_suite, shared, b"secret", b"")
    key = labeled_expand(hpke_suite, secret, b"key", context, 32)
    nonce = labeled_expand(hpke_suite, secret, b"base_nonce", context, 12)
    aad = f"kioskauth.fleet.wrap.v1\0{terminal_id.lower()}\0{generation}".encode()
    return enc, ChaCha20Poly1305(key).encrypt(nonce, data_key, aad)
