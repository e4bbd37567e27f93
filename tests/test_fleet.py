"""Two real kioskauthd terminals against one real PostgreSQL directory that the test starts
(docs/fleet.md): create, token, join and admission, a person and passcode made at A that unlock
at B, a suspension at A refused at B, a hard lock at B that reaches A, and a terminal in no
fleet that behaves as before."""

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from kioskauth_testing import FAST_HASH_CONFIG, Daemon

FLEET_CONFIG = FAST_HASH_CONFIG + """
[Passcode]
LockoutDelaysSec=0
HardLockAfter=4

[Fleet]
PollIntervalSec=3600
"""

PASSCODE = "47112358"


def _postgres_bin() -> Path | None:
    configured = os.environ.get("KIOSKAUTH_PG_BIN")
    if configured:
        return Path(configured)
    root = Path("/usr/lib/postgresql")
    versions = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()), reverse=True) if root.exists() else []
    for version in versions:
        if (root / str(version) / "bin" / "initdb").exists():
            return root / str(version) / "bin"
    return None


class Postgres:
    """A throw-away PostgreSQL on a Unix socket in a temporary directory, run as nobody when the
    test runs as root, with trust authentication (the socket directory is private)."""

    def __init__(self):
        self.bin = _postgres_bin()
        self.base = Path(tempfile.mkdtemp(prefix="kioskauth-fleet-"))
        self.run_as = None
        if os.getuid() == 0:
            self.run_as = pwd.getpwnam("nobody")
            os.chown(self.base, self.run_as.pw_uid, self.run_as.pw_gid)
        self.base.chmod(0o711)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.data = self.base / "data"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.run_as is not None:
            command = ["setpriv", f"--reuid={self.run_as.pw_uid}", f"--regid={self.run_as.pw_gid}",
                       "--clear-groups", "--"] + command
        subprocess.run(command, check=True, capture_output=True, timeout=120, cwd=self.base,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.base)})

    def start(self) -> "Postgres":
        self._run("initdb", "-D", str(self.data), "-U", "fleet", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"), "-w", "-t", "60",
                  "-o", f"-k {self.base} -c listen_addresses='' -p {self.port} -F", "start")
        return self

    def pause(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"), "-w", "-t", "60",
                  "-o", f"-k {self.base} -c listen_addresses='' -p {self.port} -F", "start")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def query(self, sql: str, database: str = "postgres") -> str:
        """One value, through psql on the socket, as the superuser."""
        out = subprocess.run([str(self.bin / "psql"), "-h", str(self.base), "-p", str(self.port), "-U", "fleet",
                              "-d", database, "-At", "-c", sql], check=True, capture_output=True, text=True,
                             timeout=30)
        return out.stdout.strip()

    @property
    def url(self) -> str:
        """The directory as its owner (here the cluster's superuser): for FleetMigrate only."""
        return self.url_as("fleet")

    def url_as(self, role: str, database: str = "postgres") -> str:
        return f"postgres://{role}@/{database}?host={self.base}&port={self.port}"

    def terminal_url(self, role: str, database: str = "postgres") -> str:
        """A new login role for one terminal (docs/fleet.md §6: the owner's
        fleet_create_terminal_role, in a migrated directory), and the URL naming it."""
        self.query(f"SELECT fleet_create_terminal_role('{role}', NULL)", database)
        return self.url_as(role, database)


@pytest.fixture(scope="module")
def postgres():
    if _postgres_bin() is None:
        pytest.skip("PostgreSQL's initdb is not installed")
    server = Postgres().start()
    yield server
    server.stop()


def terminal(make_daemon, config: str = FLEET_CONFIG, reader: str | None = None) -> Daemon:
    """A daemon with a store key and a fresh fleet key in its credentials directory, and
    libfprint's virtual `reader` when given."""
    d = make_daemon(config=config, credential_key=os.urandom(32))
    if reader is not None:
        from fprint_virtual import environment
        d.sensor = d.root / "sensor.sock"
        d.extra_env.update(environment(reader, d.sensor, base={}))
    result = d.ctl("fleet", "keygen", "--output", str(d.credentials / "kioskauth.fleet-key"))
    assert result.returncode == 0, result.stderr
    key = d.credentials / "kioskauth.fleet-key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    # The public key printed is X25519(private, 9), as an independent implementation computes it.
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    expected = X25519PrivateKey.from_private_bytes(key.read_bytes()).public_key().public_bytes(
        Encoding.Raw, PublicFormat.Raw).hex()
    assert result.stdout.strip() == expected
    # It never overwrites a key.
    again = d.ctl("fleet", "keygen", "--output", str(key))
    assert again.returncode != 0 and len(key.read_bytes()) == 32
    return d.start()


def form_pair(factory, postgres) -> tuple[Daemon, Daemon]:
    """Two terminals in one fleet, as an admin forms it with the CLI (the benches use this):
    A migrates (as the owner) and creates it, B joins with A's token, and both sync twice, so B
    is admitted and holds the key."""
    a, b = terminal(factory), terminal(factory)
    ok(a, "fleet", "migrate", postgres.url)
    ok(a, "fleet", "create", postgres.terminal_url("kt_a"), "--name", "a")
    ok(b, "fleet", "join", postgres.terminal_url("kt_b"), "--name", "b",
       input=ok(a, "fleet", "token", "issue").strip() + "\n")
    for d in (a, b, a, b):
        ok(d, "fleet", "sync")
    return a, b


def ok(d: Daemon, *args: str, input: str | None = None, timeout: float = 30.0) -> str:
    result = d.ctl(*args, input=input, timeout=timeout)
    assert result.returncode == 0, f"{args}: {result.stderr}\n{d.log_text()[-3000:]}"
    return result.stdout


def status(d: Daemon) -> dict:
    return json.loads(ok(d, "fleet", "status", "--json"))


def call(d: Daemon, method: str, **parameters) -> dict:
    return d.call(f"io.kioskauth.{method}", parameters)


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory):
    """Terminals A (created the fleet) and B (joined with A's token and was admitted)."""
    made = []

    def factory(**kwargs):
        d = Daemon(**kwargs)
        made.append(d)
        return d

    a = terminal(factory)
    b = terminal(factory)
    # The owner migrates (through A's daemon, which keeps nothing of it); then each terminal
    # gets a role of its own.
    assert "version 4" in ok(a, "fleet", "migrate", postgres.url)
    a.url, b.url = postgres.terminal_url("kt_a"), postgres.terminal_url("kt_b")
    ok(a, "fleet", "create", a.url, "--name", "a")
    token = ok(a, "fleet", "token", "issue", "--valid", "10m").strip()
    assert token.startswith("kat1.")
    joined = ok(b, "fleet", "join", b.url, "--name", "b", input=token + "\n")
    assert "pending" in joined
    # A is woken by the directory's NOTIFY and may already have admitted B; these make sure.
    assert status(b)["state"] in ("pending", "member")
    ok(a, "fleet", "sync")  # A sees B pending, checks its proof, wraps the data key to it
    ok(b, "fleet", "sync")  # B picks its wrapped key up
    a.used_token = token
    a.factory = factory
    yield a, b
    for d in made:
        d.close()


def test_joinedTerminal_isAdmitted_andHoldsTheDataKey(fleet):
    a, b = fleet
    sa, sb = status(a), status(b)
    assert sa["configured"] and sa["state"] == "member" and sa["generation"] == 1, sa
    assert sb["state"] == "member" and sb["generation"] == 1 and sb["reachable"], sb
    assert sb["lag"] == 0 and sb["queuedPushes"] == 0, sb
    assert sa["terminalId"] != sb["terminalId"]


def test_aUsedToken_andAMalformedOne_areRefused_andLeaveNoMembership(fleet, postgres):
    a, _ = fleet
    c = terminal(a.factory)
    c_url = postgres.terminal_url("kt_c")
    for token in (a.used_token, "kat1.not-a-token"):
        refused = c.ctl("fleet", "join", c_url, "--name", "c", input=token + "\n")
        assert refused.returncode != 0 and "FleetTokenInvalid" in refused.stderr, refused.stderr
        assert token not in refused.stderr
    assert status(c)["configured"] is False


def test_aUidTheDirectoryCannotHold_isRefusedOnAMember_andKeepsATerminalOutOfFleets(fleet, postgres):
    """The directory keeps uids as PostgreSQL integers. A person bound above 2^31 - 1 used to trap
    the daemon when their change was pushed, and at every sync after it (the change stays
    queued). A member refuses such a binding by name; a terminal holding one founds no fleet
    until it changes."""
    a, _ = fleet
    big = 3_000_000_000  # a valid uid (uid_t is 32-bit unsigned), beyond PostgreSQL's integer
    reply = call(a, "AddPerson", name="kim", uid=big)
    assert reply["error"] == "io.kioskauth.BindingRefused" and "2147483647" in reply["parameters"]["reason"], reply
    assert "error" not in call(a, "AddPerson", name="kim")
    reply = call(a, "BindAccount", name="kim", uid=big)
    assert reply["error"] == "io.kioskauth.BindingRefused" and "2147483647" in reply["parameters"]["reason"], reply
    assert "error" not in call(a, "BindAccount", name="kim", uid=2_147_483_647)  # the largest it holds
    ok(a, "fleet", "sync")
    assert status(a)["queuedPushes"] == 0

    # Outside any fleet the binding is a terminal's own business; founding a fleet is refused.
    postgres.query("CREATE DATABASE other_fleet")
    c = terminal(a.factory)
    assert "error" not in call(c, "AddPerson", name="lee", uid=big)
    assert "error" not in call(c, "SetPasscode", name="lee", passcode=PASSCODE, confirmation=PASSCODE)
    assert "version" in ok(c, "fleet", "migrate", postgres.url_as("fleet", "other_fleet"))
    url = postgres.terminal_url("kt_other_c", "other_fleet")
    refused = c.ctl("fleet", "create", url, "--name", "c")
    assert refused.returncode != 0, refused.stderr
    assert "lee is bound to uid 3000000000, above 2147483647" in refused.stderr, refused.stderr
    assert status(c)["configured"] is False
    # Bound to a uid the directory holds, lee goes into the new fleet with it.
    assert "error" not in call(c, "BindAccount", name="lee", uid=2_000_000_000)
    ok(c, "fleet", "create", url, "--name", "c")
    ok(c, "fleet", "sync")
    assert c.proc.poll() is None and status(c)["queuedPushes"] == 0
    assert postgres.query("SELECT uid FROM people WHERE name = 'lee'", "other_fleet") == "2000000000"


def test_personAndPasscodeMadeAtA_unlockAtB_andASuspensionAtA_isRefusedAtB(fleet):
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="carol")
    assert "error" not in call(a, "SetPasscode", name="carol", passcode=PASSCODE, confirmation=PASSCODE)
    ok(a, "fleet", "sync")
    assert status(a)["queuedPushes"] == 0
    # (B may already have pulled carol, woken by the directory's NOTIFY; the sync makes sure.)
    ok(b, "fleet", "sync")
    reply = call(b, "VerifyPasscode", name="carol", passcode=PASSCODE)
    assert "error" not in reply, reply
    assert reply["parameters"]["person"]["state"] == "active"
    # B's own unlock is not pushed back as a change of carol, and B has nothing left queued.
    ok(b, "fleet", "sync")
    assert status(b)["queuedPushes"] == 0

    assert "error" not in call(a, "SuspendPerson", name="carol", reason="badge lost")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    reply = call(b, "VerifyPasscode", name="carol", passcode=PASSCODE)
    assert reply["error"] == "io.kioskauth.PersonNotActive", reply
    assert reply["parameters"]["state"] == "suspended"
    audit = call(b, "GetAudit")["parameters"]["events"]
    assert any(e["action"] == "fleet.apply" and e.get("person") == "carol" and "suspended" in (e.get("detail") or "")
               for e in audit), audit[-5:]


def test_aHardLockAtB_reachesA_afterSync_andAResetClearsItEverywhere(fleet):
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="dave")
    assert "error" not in call(a, "SetPasscode", name="dave", passcode=PASSCODE, confirmation=PASSCODE)
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    for _ in range(4):
        reply = call(b, "VerifyPasscode", name="dave", passcode="90817263")
        assert reply["error"] in ("io.kioskauth.WrongPasscode", "io.kioskauth.PasscodeLocked"), reply
    assert call(b, "VerifyPasscode", name="dave", passcode=PASSCODE)["error"] == "io.kioskauth.PasscodeLocked"
    ok(b, "fleet", "sync")  # pushes B's failures
    ok(a, "fleet", "sync")  # A pulls the fleet-wide sum
    reply = call(a, "VerifyPasscode", name="dave", passcode=PASSCODE)
    assert reply["error"] == "io.kioskauth.PasscodeLocked" and reply["parameters"]["hardLocked"], reply
    # An admin's reset at A is pushed as a fleet-wide reset.
    assert "error" not in call(a, "ResetLockout", name="dave")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert "error" not in call(b, "VerifyPasscode", name="dave", passcode=PASSCODE)


def test_withoutAnyFleetSync_aWriteAtA_wakesItsPush_andTheNotificationWakesB(fleet):
    """The poll is an hour here: only A's wake-up on its own write and B's NOTIFY can do it."""
    import time
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="hana")
    assert "error" not in call(a, "SetPasscode", name="hana", passcode=PASSCODE, confirmation=PASSCODE)
    deadline = time.monotonic() + 30
    while "error" in call(b, "VerifyPasscode", name="hana", passcode=PASSCODE):
        assert time.monotonic() < deadline, "hana never reached B"
        time.sleep(0.1)
    assert "error" not in call(a, "SuspendPerson", name="hana")
    deadline = time.monotonic() + 30
    while call(b, "VerifyPasscode", name="hana", passcode=PASSCODE).get("error") != "io.kioskauth.PersonNotActive":
        assert time.monotonic() < deadline, "the suspension never reached B"
        time.sleep(0.1)


def test_aChangeMadeWhileBsListenerConnects_reachesB_withoutThePoll(fleet):
    """B pulls, then its listener connects. A NOTIFY sent before the LISTEN is in force reaches
    nobody: B must pull once more when it is, not wait for the hour's poll."""
    import time
    a, b = fleet
    delay = 8.0
    b.extra_env["KIOSKAUTH_TEST_FLEET_LISTEN_DELAY"] = str(delay)
    try:
        b.restart()
        # The listener starts after B's first pull of this run; the hook then holds its LISTEN.
        deadline = time.monotonic() + 30
        while "TEST HOOK ACTIVE: the fleet listener LISTENs" not in b.log_text():
            assert time.monotonic() < deadline, "B's listener never started"
            time.sleep(0.05)
        held = time.monotonic()
        assert "error" not in call(a, "AddPerson", name="ivan")
        assert "error" not in call(a, "SetPasscode", name="ivan", passcode=PASSCODE, confirmation=PASSCODE)
        ok(a, "fleet", "sync")  # in the directory now, its NOTIFY gone by
        assert time.monotonic() - held < delay - 2, "too slow to make the change while B's LISTEN was held"
        assert call(b, "VerifyPasscode", name="ivan", passcode=PASSCODE)["error"] == "io.kioskauth.NoSuchPerson"
        deadline = time.monotonic() + delay + 20
        while "error" in call(b, "VerifyPasscode", name="ivan", passcode=PASSCODE):
            assert time.monotonic() < deadline, "ivan waited for B's poll (an hour)"
            time.sleep(0.1)
    finally:
        del b.extra_env["KIOSKAUTH_TEST_FLEET_LISTEN_DELAY"]
        b.restart()


def test_aListenerThatCannotConnect_isRetriedWithBackOff_notInATightLoop(fleet, postgres):
    """B's role may hold one connection (PostgreSQL's CONNECTION LIMIT): the agent's connection
    works and every LISTEN connection is refused. Each refusal wakes the sync loop; without a
    pause of its own the listener was retried at once, over and over."""
    import time
    a, b = fleet
    postgres.query("ALTER ROLE kt_b CONNECTION LIMIT 1")
    try:
        before = b.log_text().count("fleet listener cannot connect")
        b.restart()
        deadline = time.monotonic() + 30
        while b.log_text().count("fleet listener cannot connect") == before:
            assert time.monotonic() < deadline, "B's listener was never refused"
            time.sleep(0.05)
        time.sleep(6)
        attempts = b.log_text().count("fleet listener cannot connect") - before
        # Pauses of 1, 2 and 4 s (ReconnectMaxSec is 30 by default): at most 4 attempts in ~6 s.
        assert 1 <= attempts <= 4, attempts
        assert status(b)["reachable"], status(b)  # syncs go on, on the agent's connection
    finally:
        postgres.query("ALTER ROLE kt_b CONNECTION LIMIT -1")
        b.restart()
    ok(b, "fleet", "sync")


def test_aRemovalAtA_erasesThePersonAtB(fleet):
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="frank")
    assert "error" not in call(a, "SetPasscode", name="frank", passcode=PASSCODE, confirmation=PASSCODE)
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert "error" not in call(b, "VerifyPasscode", name="frank", passcode=PASSCODE)
    assert "error" not in call(a, "RemovePerson", name="frank")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert call(b, "VerifyPasscode", name="frank", passcode=PASSCODE)["error"] == "io.kioskauth.NoSuchPerson"


def test_withTheDirectoryDown_unlocksGoOn_writesQueue_andArriveAfterwards(fleet, postgres):
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="gina")
    assert "error" not in call(a, "SetPasscode", name="gina", passcode=PASSCODE, confirmation=PASSCODE)
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    postgres.pause()
    try:
        # Unlocks are local and never wait for the directory.
        assert "error" not in call(b, "VerifyPasscode", name="gina", passcode=PASSCODE)
        assert "error" not in call(a, "SuspendPerson", name="gina")
        failed = a.ctl("fleet", "sync", timeout=90)
        assert failed.returncode != 0 and "FleetUnreachable" in failed.stderr, failed.stderr
        sa = status(a)
        assert not sa["reachable"] and sa["queuedPushes"] >= 1 and sa["lastError"], sa
    finally:
        postgres.resume()
    # A sync of the service may still be finding out that its old connection is dead (bounded
    # by the agent's per-operation deadline), so this one may wait behind it.
    ok(a, "fleet", "sync", timeout=90)
    assert status(a)["queuedPushes"] == 0
    ok(b, "fleet", "sync")
    assert call(b, "VerifyPasscode", name="gina", passcode=PASSCODE)["error"] == "io.kioskauth.PersonNotActive"


def test_auditEvents_arePushed_once_withTheirTerminal(fleet, postgres):
    a, b = fleet
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    for d in (a, b):
        terminal_id = status(d)["terminalId"]
        events = call(d, "GetAudit", limit=100000)["parameters"]["events"]
        # Everything up to the last sync is in the directory (entries appended since may not be).
        stored = int(postgres.query(f"SELECT count(*) FROM audit_events WHERE terminal_id = '{terminal_id}'"))
        assert 0 < stored <= len(events)
        distinct = int(postgres.query(
            f"SELECT count(DISTINCT terminal_sequence) FROM audit_events WHERE terminal_id = '{terminal_id}'"))
        assert distinct == stored
    # Pushing again adds nothing that was already there.
    before = int(postgres.query("SELECT count(*) FROM audit_events"))
    ok(a, "fleet", "sync")
    assert int(postgres.query("SELECT count(*) - count(DISTINCT (terminal_id, terminal_sequence)) FROM audit_events")) == 0
    assert int(postgres.query("SELECT count(*) FROM audit_events")) >= before


def test_aFingerEnrolledAtA_verifiesAtB_withTheSameKindOfReader_andItsRemovalFollows(make_daemon, postgres):
    from test_fingerprint_e2e import enroll, verify_on
    from kioskauth_testing import connect
    postgres.query("CREATE DATABASE fingers")
    a = terminal(make_daemon, reader="virtual_device")
    b = terminal(make_daemon, reader="virtual_device")
    ok(a, "fleet", "migrate", postgres.url_as("fleet", "fingers"))
    ok(a, "fleet", "create", postgres.terminal_url("kt_fa", "fingers"), "--name", "fa")
    ok(b, "fleet", "join", postgres.terminal_url("kt_fb", "fingers"), "--name", "fb",
       input=ok(a, "fleet", "token", "issue").strip() + "\n")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert status(b)["state"] == "member"
    assert "error" not in call(a, "AddPerson", name="sarah")
    assert "error" not in call(a, "SetPasscode", name="sarah", passcode=PASSCODE, confirmation=PASSCODE)
    reply, _ = enroll(a, a.sensor, "sarah", "sarah-right-index")
    assert "error" not in reply, reply
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    fingers = call(b, "ListFingers", name="sarah")
    assert "error" not in fingers, fingers
    s = connect(b.socket, timeout=30)
    assert "error" not in verify_on(s, b.sensor, "sarah-right-index")
    assert verify_on(s, b.sensor, "someone-else")["error"] == "io.kioskauth.FingerprintNotRecognized"
    s.close()
    # A terminal with another kind of reader takes the person but not the template.
    c = terminal(make_daemon, reader="virtual_image")
    ok(c, "fleet", "join", postgres.terminal_url("kt_fc", "fingers"), "--name", "fc",
       input=ok(a, "fleet", "token", "issue").strip() + "\n")
    ok(a, "fleet", "sync")
    ok(c, "fleet", "sync")
    assert status(c)["state"] == "member"
    assert call(c, "GetPerson", name="sarah")["parameters"]["person"]["fingers"] == []
    assert "error" not in call(a, "RemoveFinger", name="sarah", finger="right-index")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert call(b, "GetPerson", name="sarah")["parameters"]["person"]["fingers"] == []


def test_terminalsUseTheirOwnRoles_theOwnerOrASuperuserIsRefused_andTheOwnersURLIsNotKept(fleet, postgres):
    a, b = fleet
    # A and B hold the roles they were given; no connection to the directory is the owner's,
    # although A's daemon migrated it with the owner's URL.
    roles = dict(postgres.query("SELECT name, db_role FROM terminals ORDER BY name").split("\n")[i].split("|")
                 for i in range(2))
    assert roles == {"a": "kt_a", "b": "kt_b"}, roles
    ok(a, "fleet", "sync")
    users = set(postgres.query(
        "SELECT DISTINCT usename FROM pg_stat_activity WHERE backend_type = 'client backend' "
        "AND pid <> pg_backend_pid() AND datname = 'postgres'").split())
    assert users and all(user.startswith("kt_") for user in users), users
    assert status(a)["directory"] == a.url

    c = terminal(a.factory)
    # The superuser (here also the owner) is refused as a terminal's role, before anything is
    # registered.
    refused = c.ctl("fleet", "create", postgres.url, "--name", "c-owner")
    assert refused.returncode != 0 and "FleetPermissionDenied" in refused.stderr, refused.stderr
    assert "superuser" in refused.stderr
    # A terminal role on a directory nobody migrated cannot migrate it itself.
    postgres.query("CREATE DATABASE unmigrated")
    postgres.query("CREATE ROLE kt_unmigrated LOGIN IN ROLE kioskauth_terminal")
    refused = c.ctl("fleet", "create", postgres.url_as("kt_unmigrated", "unmigrated"), "--name", "c-early")
    assert refused.returncode != 0 and "FleetPermissionDenied" in refused.stderr, refused.stderr
    assert "fleet migrate" in refused.stderr
    assert postgres.query("SELECT to_regclass('terminals') IS NULL", "unmigrated") == "t"
    assert status(c)["configured"] is False
    assert postgres.query("SELECT count(*) FROM terminals WHERE name LIKE 'c-%'") == "0"
    # Migrating is for root and admins.
    reply = c.call("io.kioskauth.FleetMigrate", {"directory": postgres.url}, user="nobody")
    assert reply["error"].endswith("PermissionDenied"), reply


def test_aForgedPeopleRow_isNotApplied_andIsReported_andAReplayIsRefusedAfterARestart(fleet, postgres):
    """The directory's superuser edits a person's row. The terminals refuse what the row MAC
    does not cover, audit it and show it in fleet status; an older genuine row copied back is
    refused as replayed, after a restart too (the versions are kept in the store)."""
    a, b = fleet
    assert "error" not in call(a, "AddPerson", name="mallory")
    assert "error" not in call(a, "SetPasscode", name="mallory", passcode=PASSCODE, confirmation=PASSCODE)
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert "error" not in call(b, "VerifyPasscode", name="mallory", passcode=PASSCODE)
    # Keep her genuine, active row, MAC and all, for the replay.
    postgres.query("CREATE TABLE saved_mallory AS SELECT * FROM people WHERE name = 'mallory'")
    assert "error" not in call(a, "SuspendPerson", name="mallory", reason="left")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert call(b, "VerifyPasscode", name="mallory", passcode=PASSCODE)["error"] == "io.kioskauth.PersonNotActive"
    before = status(b)["rejectedChanges"]

    # 1. Flip her back to active, and bind her to another uid, as the superuser.
    postgres.query("UPDATE people SET state = 'active' WHERE name = 'mallory'")
    ok(b, "fleet", "sync")
    reply = call(b, "VerifyPasscode", name="mallory", passcode=PASSCODE)
    assert reply["error"] == "io.kioskauth.PersonNotActive", reply
    sb = status(b)
    assert sb["rejectedChanges"] == before + 1, sb
    assert "forged" in sb["lastRejection"] and "people" in sb["lastRejection"], sb
    assert "refused:" in ok(b, "fleet", "status")
    postgres.query("UPDATE people SET uid = 4242 WHERE name = 'mallory'")
    ok(b, "fleet", "sync")
    person = call(b, "GetPerson", name="mallory")["parameters"]["person"]
    assert person["state"] == "suspended" and person.get("uid") is None, person
    assert status(b)["rejectedChanges"] == before + 2
    audit = call(b, "GetAudit")["parameters"]["events"]
    refusals = [e for e in audit if e["action"] == "fleet.reject"]
    assert len(refusals) >= 2 and all(e["result"] == "refused" and "forged" in e["detail"] for e in refusals[-2:])
    # A, which wrote the row, refuses the forgeries too and still has her suspended.
    ok(a, "fleet", "sync")
    assert status(a)["rejectedChanges"] >= 2
    assert call(a, "VerifyPasscode", name="mallory", passcode=PASSCODE)["error"] == "io.kioskauth.PersonNotActive"

    # 2. After B restarts, copy her older genuine row (active, correctly MACed) back.
    b.restart()
    assert status(b)["state"] == "member" and status(b)["generation"] >= 1
    postgres.query(
        "UPDATE people p SET state = s.state, uid = s.uid, role = s.role, generation = s.generation, "
        "version = s.version, mac = s.mac FROM saved_mallory s WHERE p.person_id = s.person_id")
    ok(b, "fleet", "sync")
    reply = call(b, "VerifyPasscode", name="mallory", passcode=PASSCODE)
    assert reply["error"] == "io.kioskauth.PersonNotActive", reply
    sb = status(b)
    assert sb["rejectedChanges"] == before + 3 and "replayed" in sb["lastRejection"], sb
    # A genuine change still arrives: the feed did not stall on the refused rows.
    assert "error" not in call(a, "ResumePerson", name="mallory")
    ok(a, "fleet", "sync")
    ok(b, "fleet", "sync")
    assert "error" not in call(b, "VerifyPasscode", name="mallory", passcode=PASSCODE)


def test_leaving_marksTheTerminalRemoved_forgetsTheFleet_andKeepsItsPeople(fleet, postgres):
    a, _ = fleet
    d = terminal(a.factory)
    ok(d, "fleet", "join", postgres.terminal_url("kt_d"), "--name", "d", input=ok(a, "fleet", "token", "issue").strip() + "\n")
    ok(a, "fleet", "sync")
    ok(d, "fleet", "sync")
    sd = status(d)
    assert sd["state"] == "member", sd
    assert "error" not in call(d, "VerifyPasscode", name="dave", passcode=PASSCODE)
    ok(d, "fleet", "leave")
    assert status(d)["configured"] is False
    assert postgres.query(f"SELECT state FROM terminals WHERE terminal_id = '{sd['terminalId']}'") == "removed"
    assert postgres.query(f"SELECT count(*) FROM wrapped_keys WHERE terminal_id = '{sd['terminalId']}'") == "0"
    # Local people stay, and nothing is queued for a fleet any more.
    assert "error" not in call(d, "VerifyPasscode", name="dave", passcode=PASSCODE)
    assert "error" not in call(d, "SuspendPerson", name="dave")
    assert status(d)["queuedPushes"] == 0
    assert call(d, "FleetSync")["error"] == "io.kioskauth.FleetNotConfigured"


def test_twoCreatesAtOnceOnOneTerminal_makeOneFleet_andTheOtherIsToldItIsAMember(fleet, postgres):
    """Membership commands run one at a time on a terminal. Two `fleet create` at once used to
    interleave: each closed the other's directory connection, and the second met the first's
    fleet as a conflict (and its attempt record replaced the first's). Now the second waits,
    then finds the first's membership."""
    import threading

    a, _ = fleet
    postgres.query("CREATE DATABASE twin_fleet")
    c = terminal(a.factory)
    assert "version" in ok(c, "fleet", "migrate", postgres.url_as("fleet", "twin_fleet"))
    url = postgres.terminal_url("kt_twin", "twin_fleet")
    replies: list[dict] = []

    def create(name: str) -> None:
        replies.append(call(c, "FleetCreate", directory=url, name=name))

    threads = [threading.Thread(target=create, args=(name,)) for name in ("twin-1", "twin-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    errors = sorted(reply.get("error", "") for reply in replies)
    assert errors == ["", "io.kioskauth.FleetAlreadyMember"], replies
    assert postgres.query("SELECT count(*) FROM terminals", "twin_fleet") == "1"
    created = next(reply for reply in replies if "error" not in reply)
    assert status(c)["terminalId"] == created["parameters"]["terminalId"]
    assert postgres.query("SELECT terminal_id FROM terminals", "twin_fleet") == status(c)["terminalId"]
    ok(c, "fleet", "leave")


def test_fleetMethods_refuseCallersWhoAreNotAdmins(fleet):
    a, _ = fleet
    for method in ("FleetStatus", "FleetSync", "FleetIssueJoinToken", "FleetLeave"):
        reply = a.call(f"io.kioskauth.{method}", {}, user="nobody")
        assert reply["error"] == "org.varlink.service.PermissionDenied" or reply["error"].endswith("PermissionDenied"), reply
    assert status(a)["state"] == "member"


def test_aTerminalInNoFleet_isUnchanged(make_daemon):
    d = make_daemon(config=FLEET_CONFIG).start()
    assert status(d) == {**status(d), "configured": False, "queuedPushes": 0, "generation": 0}
    assert "not in a fleet" in ok(d, "fleet", "status")
    assert call(d, "FleetSync")["error"] == "io.kioskauth.FleetNotConfigured"
    assert "error" not in call(d, "AddPerson", name="erin")
    assert "error" not in call(d, "SetPasscode", name="erin", passcode=PASSCODE, confirmation=PASSCODE)
    assert "error" not in call(d, "VerifyPasscode", name="erin", passcode=PASSCODE)
    assert status(d)["queuedPushes"] == 0
    # No connection to anything: none of the daemon's sockets is a TCP connection.
    inodes = {link[len("socket:["):-1] for link in open_descriptors(d.proc.pid) if link.startswith("socket:[")}
    tcp = [line.split() for name in ("tcp", "tcp6")
           for line in Path(f"/proc/{d.proc.pid}/net/{name}").read_text().splitlines()[1:]]
    assert not [fields for fields in tcp if fields[9] in inodes], "the daemon holds a TCP socket"


def open_descriptors(pid):
    """What each of pid's open descriptors points at. A descriptor closed between the listing and
    its readlink (the daemon finishing with a client's connection) is not open, so it is skipped."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return links
