"""Connections that arrive while the daemon shuts down.

A connection accepted just as the socket server stops can be dropped by the server's stream
before it is served. NIO traps when such a connection's writer is released unfinished, so the
daemon crashed on SIGTERM (status -4, "Deinited NIOAsyncWriter without calling finish()") when a
client connected at that moment: seen once in CI, in test_activation's restart test. Here
clients connect as fast as they can while the daemon is told to stop, many times over: it must
exit 0 every time, and every client gets an answer or an end of file, never a hang.
"""

from __future__ import annotations

import socket
import threading
import time

from kioskauth_testing import FAST_HASH_CONFIG, Daemon

ROUNDS = 12
CLIENT_THREADS = 6


def hammer(path: str, stop: threading.Event, hung: list[str]) -> None:
    while not stop.is_set():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(path)
                client.sendall(b'{"method":"io.kioskauth.GetStatus"}\0')
                while b"\0" not in (data := client.recv(65536)) and data:
                    pass
        except socket.timeout:
            hung.append("a connection got neither an answer nor an end of file in 10 s")
        except OSError:
            pass  # refused or reset: the socket is going away


def test_connections_during_shutdown_never_crash_the_daemon():
    for round_ in range(ROUNDS):
        daemon = Daemon(config=FAST_HASH_CONFIG).start()
        stop, hung = threading.Event(), []
        clients = [threading.Thread(target=hammer, args=(str(daemon.socket), stop, hung))
                   for _ in range(CLIENT_THREADS)]
        try:
            for client in clients:
                client.start()
            time.sleep(0.05 + 0.02 * (round_ % 5))
            status = daemon.stop()
        finally:
            stop.set()
            for client in clients:
                client.join(timeout=30)
            daemon.close()
        log = daemon.log_path.read_text(errors="replace")
        assert status == 0, f"round {round_}: kioskauthd exited {status}:\n{log[-3000:]}"
        assert "Fatal error" not in log, log[-3000:]
        assert not hung, hung[:3]
