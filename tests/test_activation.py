"""The store key and the daemon under systemd's protocols, without PID 1: the key unit's script
with the real systemd-creds, and the real kioskauthd socket-activated by systemd-socket-activate,
reporting readiness and its watchdog on a datagram NOTIFY_SOCKET, and opening its store with a
key decrypted the way LoadCredentialEncrypted= does.

Tests that need the daemon skip, saying so, until $KIOSKAUTH_BIN_DIR/kioskauthd exists.

Run: KIOSKAUTH_BIN_DIR=.build/debug python3 -m pytest tests/test_activation.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from systemd_support import (
    REPO,
    STORE_KEY_BYTES,
    STORE_KEY_CREDENTIAL,
    NotifyReceiver,
    UserManager,
    WatchdogWatcher,
    connect,
    creds_env,
    ctl_binary,
    daemon_binary,
    daemon_directories,
    decrypt_into_credentials_directory,
    missing_daemon_reason,
    run,
    socket_activated_daemon,
    stage_install,
    stop,
    tree_snapshot,
    user_manager_unavailable_reason,
)

SCRIPT = REPO / "systemd/kioskauth-store-key"
STORE_NAME = "kioskauth.sqlite"
# Short enough to watch several periods in a test; the unit uses 30 s.
WATCHDOG_USEC = 1_000_000
READY_TIMEOUT = 60.0

needs_creds = pytest.mark.skipif(shutil.which("systemd-creds") is None,
                                 reason="systemd-creds is not installed")
needs_daemon = pytest.mark.skipif(daemon_binary() is None, reason=missing_daemon_reason())
needs_activate = pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                                    reason="systemd-socket-activate is not installed")


@pytest.fixture
def host_secret(tmp_path) -> Path:
    """A test host key: systemd-creds creates it on first use at $SYSTEMD_CREDENTIAL_SECRET."""
    return tmp_path / "credential.secret"


def make_store_key(sealed: Path, store: Path, host_secret: Path, **environment: str):
    """Runs the key unit's script as the unit does, sealing with the test host key."""
    env = {**creds_env(host_secret), "KIOSKAUTH_WITH_KEY": "host", **environment}
    return run([SCRIPT, sealed, store], env=env)


def decrypt(sealed: Path, host_secret: Path) -> bytes:
    result = run(
        ["systemd-creds", "decrypt", f"--name={STORE_KEY_CREDENTIAL}", sealed, "-"],
        env=creds_env(host_secret), text=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- The key unit's script ------------------------------------------------------------------------


@needs_creds
def test_storeKey_whenNothingExists_createsSealed32ByteKey(tmp_path, host_secret):
    sealed = tmp_path / "credstore.encrypted/kioskauth.store-key"
    result = make_store_key(sealed, tmp_path / "state" / STORE_NAME, host_secret)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o600
    assert stat.S_IMODE(sealed.parent.stat().st_mode) == 0o700
    key = decrypt(sealed, host_secret)
    assert len(key) == STORE_KEY_BYTES
    assert key not in sealed.read_bytes(), "the key must not be stored in the clear"
    assert [p.name for p in sealed.parent.iterdir()] == ["kioskauth.store-key"]  # no temp files


@needs_creds
def test_storeKey_sealedUnderItsCredentialName(tmp_path, host_secret):
    # LoadCredentialEncrypted=kioskauth.store-key:... checks the embedded name.
    sealed = tmp_path / "key"
    assert make_store_key(sealed, tmp_path / "state" / STORE_NAME, host_secret).returncode == 0
    wrong_name = run(["systemd-creds", "decrypt", "--name=something-else", sealed, "-"],
                     env=creds_env(host_secret))
    assert wrong_name.returncode != 0
    assert len(decrypt(sealed, host_secret)) == STORE_KEY_BYTES


@needs_creds
def test_storeKey_twoKeys_differ(tmp_path, host_secret):
    first, second = tmp_path / "a/key", tmp_path / "b/key"
    for sealed in (first, second):
        assert make_store_key(sealed, tmp_path / "state" / STORE_NAME, host_secret).returncode == 0
    assert decrypt(first, host_secret) != decrypt(second, host_secret)


@needs_creds
def test_storeKey_whenKeyExists_leavesItAlone(tmp_path, host_secret):
    sealed = tmp_path / "key"
    store = tmp_path / "state" / STORE_NAME
    assert make_store_key(sealed, store, host_secret).returncode == 0
    before = sealed.read_bytes()
    store.parent.mkdir()
    store.write_bytes(b"a store")  # with its key present, a store is no reason to fail
    result = make_store_key(sealed, store, host_secret)
    assert result.returncode == 0
    assert "nothing to do" in result.stdout
    assert sealed.read_bytes() == before


@needs_creds
@pytest.mark.parametrize("side_file", ["", "-wal", "-shm", "-journal"])
def test_storeKey_whenStoreExistsWithoutKey_refuses(tmp_path, host_secret, side_file):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / f"{STORE_NAME}{side_file}").write_bytes(b"SQLite format 3\0")
    sealed = tmp_path / "credstore.encrypted/kioskauth.store-key"
    result = make_store_key(sealed, state / STORE_NAME, host_secret)
    assert result.returncode != 0
    assert "refusing to create a new store key" in result.stderr
    assert "RECOVERY" in result.stderr
    assert not sealed.exists()


@needs_creds
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
@pytest.mark.parametrize("hidden_by", ["state directory", "an ancestor"])
def test_storeKey_whenStoreCannotBeSeen_refuses(host_secret, hidden_by):
    # A store the script cannot see must not look like no store. Runs as nobody, in a directory
    # nobody may traverse (pytest's own tmp directory is private to root, so make one).
    top = Path(tempfile.mkdtemp(prefix="kioskauth-key-test-"))
    try:
        top.chmod(0o755)
        state = top / "lib/kioskauth"
        state.mkdir(parents=True, mode=0o700)
        (state / STORE_NAME).write_bytes(b"SQLite format 3\0")
        (top / "lib").chmod(0o700 if hidden_by == "an ancestor" else 0o755)
        keys = top / "keys"
        keys.mkdir()
        os.chown(keys, 65534, 65534)
        sealed = keys / "kioskauth.store-key"
        env = {**creds_env(host_secret), "KIOSKAUTH_WITH_KEY": "host"}
        result = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SCRIPT,
                      sealed, state / STORE_NAME], env=env)
        assert result.returncode != 0
        assert "refusing to create a key" in result.stderr
        assert not sealed.exists()
    finally:
        shutil.rmtree(top)


# --- The daemon, socket-activated -----------------------------------------------------------------


def start_daemon(tmp: Path, dirs, credentials: Path, watchdog_pid: str | None = "own"):
    """Starts kioskauthd socket-activated, as kioskauthd.socket and .service would, and makes the
    first connection. `watchdog_pid`: "own" (what systemd sets), None (unset) or a PID string.
    Returns (process, notify receiver, listen path, client connection)."""
    listen = tmp / f"listen-{time.monotonic_ns()}" / "io.kioskauth"
    listen.parent.mkdir()
    notify = NotifyReceiver(tmp / f"notify-{time.monotonic_ns()}")
    environment = {
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
        "CREDENTIALS_DIRECTORY": str(credentials),
    }
    if watchdog_pid not in (None, "own"):
        environment["WATCHDOG_PID"] = watchdog_pid
    process = socket_activated_daemon(listen, dirs, environment,
                                      watchdog_pid_is_own=watchdog_pid == "own")
    client = connect(listen)  # the first connection makes systemd-socket-activate exec it
    return process, notify, listen, client


@pytest.fixture
def sealed_key(tmp_path, host_secret) -> Path:
    """A store key made by the key unit's script, as on a fresh terminal."""
    sealed = tmp_path / "credstore.encrypted/kioskauth.store-key"
    result = make_store_key(sealed, tmp_path / "state" / STORE_NAME, host_secret)
    assert result.returncode == 0, result.stderr
    return sealed


@pytest.fixture
def credentials(tmp_path, sealed_key, host_secret) -> Path:
    return decrypt_into_credentials_directory(sealed_key, host_secret, tmp_path / "credentials")


@pytest.fixture
def dirs(tmp_path):
    return daemon_directories(tmp_path)


def ensure_stopped(process, notify):
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)
    status = stop(process)
    notify.close()
    return status


@needs_daemon
@needs_activate
@needs_creds
def test_daemon_socketActivated_notifiesReadyAndWatchdog(tmp_path, dirs, credentials):
    process, notify, listen, client = start_daemon(tmp_path, dirs, credentials)
    try:
        ready = notify.wait_for("READY", "1", timeout=READY_TIMEOUT)
        assert ready is not None, "no READY=1 on NOTIFY_SOCKET"
        time.sleep(3.2 * WATCHDOG_USEC / 1e6)
        pings = [t for t in notify.times_of("WATCHDOG", "1") if t >= ready.at]
        assert len(pings) >= 4, f"expected a WATCHDOG=1 every {WATCHDOG_USEC / 2e6} s: {pings}"
        beats = [ready.at] + pings
        gaps = [b - a for a, b in zip(beats, beats[1:])]
        assert max(gaps) < WATCHDOG_USEC / 1e6, f"a watchdog deadline was missed: {gaps}"
        assert not WatchdogWatcher(notify, WATCHDOG_USEC / 1e6).missed_deadline()
        assert process.poll() is None
    finally:
        client.close()
        status, _, stderr = ensure_stopped(process, notify)
    assert status == 0, stderr
    assert notify.wait_for("STOPPING", "1", timeout=0) is not None
    # systemd-socket-activate bound the socket; the daemon must not have unlinked it.
    assert stat.S_ISSOCK(listen.lstat().st_mode)


@needs_daemon
@needs_activate
@needs_creds
def test_daemon_withWatchdogPidUnset_stillSendsWatchdog(tmp_path, dirs, credentials):
    process, notify, _, client = start_daemon(tmp_path, dirs, credentials, watchdog_pid=None)
    try:
        ready = notify.wait_for("READY", "1", timeout=READY_TIMEOUT)
        assert ready is not None
        assert notify.wait_for("WATCHDOG", "1", timeout=WATCHDOG_USEC / 1e6,
                               after=ready.at) is not None
    finally:
        client.close()
        ensure_stopped(process, notify)


@needs_daemon
@needs_activate
@needs_creds
def test_daemon_whenWatchdogMeantForAnotherProcess_doesNotSend(tmp_path, dirs, credentials):
    process, notify, _, client = start_daemon(tmp_path, dirs, credentials, watchdog_pid="1")
    try:
        ready = notify.wait_for("READY", "1", timeout=READY_TIMEOUT)
        assert ready is not None
        time.sleep(2 * WATCHDOG_USEC / 1e6)
        assert notify.times_of("WATCHDOG", "1") == []
    finally:
        client.close()
        ensure_stopped(process, notify)


@needs_daemon
@needs_activate
@needs_creds
def test_daemon_thatStopsSending_isNoticed(tmp_path, dirs, credentials):
    process, notify, _, client = start_daemon(tmp_path, dirs, credentials)
    watcher = WatchdogWatcher(notify, WATCHDOG_USEC / 1e6)
    try:
        assert notify.wait_for("READY", "1", timeout=READY_TIMEOUT) is not None
        assert notify.wait_for("WATCHDOG", "1", timeout=WATCHDOG_USEC / 1e6) is not None
        assert not watcher.missed_deadline()

        os.kill(process.pid, signal.SIGSTOP)  # hung, as far as anyone outside can tell
        stopped_at = time.monotonic()
        time.sleep(1.5 * WATCHDOG_USEC / 1e6)
        assert watcher.missed_deadline(), "a silent daemon went unnoticed"
        # Pings are timed when the watcher's thread reads them: one sent just before the stop may
        # be read a little after it. A stopped daemon sends nothing for the 1.5 periods slept.
        assert watcher.last_ping() < stopped_at + 0.25

        os.kill(process.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        assert notify.wait_for("WATCHDOG", "1", timeout=WATCHDOG_USEC / 1e6,
                               after=resumed_at) is not None
        assert not watcher.missed_deadline()
    finally:
        client.close()
        ensure_stopped(process, notify)


@needs_daemon
@needs_activate
@needs_creds
def test_daemon_statusOverTheActivatedSocket(tmp_path, dirs, credentials):
    ctl = ctl_binary()
    if ctl is None:
        pytest.skip("kioskauthctl is not built")
    process, notify, listen, client = start_daemon(tmp_path, dirs, credentials)
    try:
        assert notify.wait_for("READY", "1", timeout=READY_TIMEOUT) is not None
        result = run([ctl, f"--socket={listen}", "status"], timeout=30)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
    finally:
        client.close()
        ensure_stopped(process, notify)


# --- The store key opens the store; another key is refused -----------------------------------------


@needs_daemon
@needs_activate
@needs_creds
def test_sealedKey_opensTheStoreAgainAfterRestart(tmp_path, dirs, credentials):
    for run_number in (1, 2):
        process, notify, _, client = start_daemon(tmp_path, dirs, credentials)
        try:
            assert notify.wait_for("READY", "1", timeout=READY_TIMEOUT) is not None, (
                f"start {run_number}: not ready"
            )
        finally:
            client.close()
            status, _, stderr = ensure_stopped(process, notify)
        assert status == 0, stderr
        assert (dirs.state / STORE_NAME).is_file(), "the daemon did not create its store"


@needs_daemon
@needs_activate
@needs_creds
def test_differentKey_isRefusedAndNothingChanges(tmp_path, dirs, credentials, host_secret):
    process, notify, _, client = start_daemon(tmp_path, dirs, credentials)
    try:
        assert notify.wait_for("READY", "1", timeout=READY_TIMEOUT) is not None
    finally:
        client.close()
        ensure_stopped(process, notify)
    assert (dirs.state / STORE_NAME).is_file()
    before = tree_snapshot(dirs.state)

    other_sealed = tmp_path / "other/kioskauth.store-key"
    result = make_store_key(other_sealed, tmp_path / "nowhere" / STORE_NAME, host_secret)
    assert result.returncode == 0, result.stderr
    other = decrypt_into_credentials_directory(other_sealed, host_secret, tmp_path / "other-creds")
    assert (other / STORE_KEY_CREDENTIAL).read_bytes() != (credentials / STORE_KEY_CREDENTIAL).read_bytes()

    process, notify, _, client = start_daemon(tmp_path, dirs, other)
    try:
        process.wait(timeout=READY_TIMEOUT)  # it must exit by itself
    except Exception:
        pass
    finally:
        client.close()
        exited_by_itself = process.poll() is not None
        status, _, stderr = ensure_stopped(process, notify)
    assert exited_by_itself, "the daemon kept running with a key that does not open its store"
    assert status != 0, "the daemon accepted a key that does not open its store"
    assert notify.wait_for("READY", "1", timeout=0) is None
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "no error message"
    assert any("key" in line.lower() for line in lines), stderr
    assert tree_snapshot(dirs.state) == before, "a refused key changed the store"


# --- The whole unit set under a real systemd manager ----------------------------------------------

# Test-only settings, each for a reason the real system does not have:
#   WatchdogSec=2s: to watch the manager enforce it within a test's time (the unit has 30 s).
#   No real reader may be touched; the daemon's stderr is kept for the assertions.
MANAGER_DROP_INS = {
    "kioskauthd.service.d/50-test.conf": (
        "[Service]\n"
        "WatchdogSec=2s\n"
        "RestartSec=100ms\n"
        "Environment=FP_DRIVERS_ALLOWLIST=virtual_image FP_DRIVERS_WHITELIST=virtual_image\n"
        "StandardError=append:/run/kioskauthd.stderr\n"
    ),
}
SEALED = "/etc/credstore.encrypted/kioskauth.store-key"
STORE = "/var/lib/kioskauth/kioskauth.sqlite"
SOCKET = "/run/kioskauth/io.kioskauth"

needs_manager = pytest.mark.skipif(
    user_manager_unavailable_reason() is not None,
    reason=str(user_manager_unavailable_reason()),
)


@pytest.fixture
def manager(tmp_path):
    staged = stage_install(tmp_path / "stage", prefix="/usr/local",
                           extra=["SYSTEMDSYSTEMUNITDIR=/usr/local/lib/systemd/user"])
    work = tmp_path / "manager"
    work.mkdir()
    instance = UserManager(work, staged.root, MANAGER_DROP_INS)
    yield instance
    instance.close()


def diagnostics(manager) -> str:
    stderr = manager.path("/run/kioskauthd.stderr")
    return (manager.systemctl("status", "kioskauthd.service", "kioskauthd-store-key.service").stdout
            + "\n--- kioskauthd's stderr:\n" + (stderr.read_text() if stderr.exists() else ""))


def activate(manager) -> str:
    """Connects to the socket as a client would; returns the service's state once settled."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(manager.path(SOCKET)))
        return manager.wait_for_state("kioskauthd.service", {"active", "failed"})


@needs_daemon
@needs_manager
def test_manager_socketActivatesDaemon_andStoppingItKeepsTheSocket(manager):
    assert manager.systemctl("start", "kioskauthd.socket").returncode == 0
    socket_path = manager.path(SOCKET)
    assert stat.S_ISSOCK(socket_path.lstat().st_mode)
    assert stat.S_IMODE(socket_path.lstat().st_mode) == 0o666

    # Type=notify: "active" only once the daemon sent READY=1 to the real manager.
    assert activate(manager) == "active", diagnostics(manager)
    assert manager.path(SEALED).is_file(), "the key unit did not create the store key"
    assert manager.path(STORE).is_file(), "the daemon did not open a store with the key"

    assert manager.systemctl("stop", "kioskauthd.service").returncode == 0
    assert manager.property("kioskauthd.service", "ActiveState") == "inactive"
    assert stat.S_ISSOCK(socket_path.lstat().st_mode), "stopping the service removed the socket"
    assert activate(manager) == "active", "the socket no longer activates the service"


@needs_daemon
@needs_manager
def test_manager_killsAndRestartsADaemonThatStopsSendingWatchdog(manager):
    assert manager.systemctl("start", "kioskauthd.socket").returncode == 0
    assert activate(manager) == "active", diagnostics(manager)
    first = int(manager.property("kioskauthd.service", "MainPID"))
    os.kill(first, signal.SIGSTOP)  # hung, as far as the manager can tell
    try:
        # The manager notices the missed WATCHDOG=1 and sends WatchdogSignal= (SIGABRT), then
        # SIGCONT so that even a stopped process receives it.
        deadline = time.monotonic() + 15
        while manager.property("kioskauthd.service", "ActiveState") == "active":
            assert time.monotonic() < deadline, "the manager did not notice the silent daemon"
            time.sleep(0.1)
    finally:
        try:
            os.kill(first, signal.SIGCONT)
        except ProcessLookupError:
            pass  # already gone, as expected
    deadline = time.monotonic() + 30
    while True:
        pid = int(manager.property("kioskauthd.service", "MainPID") or 0)
        if pid not in (0, first) and manager.property("kioskauthd.service", "ActiveState") == "active":
            break
        assert time.monotonic() < deadline, "the manager did not restart the daemon"
        time.sleep(0.2)
    assert int(manager.property("kioskauthd.service", "NRestarts")) >= 1


@needs_daemon
@needs_manager
def test_manager_storeWithoutKey_isNeverGivenANewKey(manager):
    assert manager.systemctl("start", "kioskauthd.socket").returncode == 0
    assert activate(manager) == "active", diagnostics(manager)
    assert manager.systemctl("stop", "kioskauthd.service").returncode == 0
    store_before = tree_snapshot(manager.path("/var/lib/kioskauth"))
    manager.path(SEALED).unlink()  # the key is lost; the store remains

    result = manager.systemctl("start", "kioskauthd.service")
    assert result.returncode != 0
    assert manager.property("kioskauthd-store-key.service", "Result") == "exit-code"
    assert manager.property("kioskauthd.service", "ActiveState") != "active"
    assert not manager.path(SEALED).exists(), "a new key was made for an existing store"
    assert tree_snapshot(manager.path("/var/lib/kioskauth")) == store_before


@needs_daemon
@needs_manager
def test_manager_differentKey_daemonRefusesAndStoreUnchanged(manager):
    assert manager.systemctl("start", "kioskauthd.socket").returncode == 0
    assert activate(manager) == "active", diagnostics(manager)
    assert manager.systemctl("stop", "kioskauthd.service").returncode == 0
    store_before = tree_snapshot(manager.path("/var/lib/kioskauth"))

    # Another key, made by the key unit itself (it creates one while no store is in sight).
    manager.path(SEALED).unlink()
    manager.path("/var/lib/kioskauth").rename(manager.path("/var/lib/kioskauth.aside"))
    assert manager.systemctl("start", "kioskauthd-store-key.service").returncode == 0
    assert manager.path(SEALED).is_file()
    manager.path("/var/lib/kioskauth.aside").rename(manager.path("/var/lib/kioskauth"))

    manager.systemctl("start", "kioskauthd.service")
    state = manager.wait_for_state("kioskauthd.service", {"failed", "active"}, timeout=60)
    assert state != "active", "the daemon accepted a key that does not open its store"
    assert manager.property("kioskauthd.service", "Result") == "exit-code"
    stderr = manager.path("/run/kioskauthd.stderr").read_text()
    assert "key" in stderr.lower(), stderr
    assert tree_snapshot(manager.path("/var/lib/kioskauth")) == store_before
