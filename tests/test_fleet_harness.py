"""The fleet tests' own tools do what the fleet tests rely on (tests/fleet_support.py): the
directory server starts, restarts and always stops; the relay really cuts, stalls and restores
the path to it. Checked with PostgreSQL's own psql, no kioskauth code involved."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from fleet_support import DATABASE, ROLE, Postgres, Proxy, postgres_available

pytestmark = pytest.mark.skipif(not postgres_available(), reason="PostgreSQL is not installed (scripts/install-deps)")


def through(server: Postgres, proxy: Proxy, query: str, password: str | None = None, timeout: float = 30):
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PGPASSWORD": password or server.password,
           "PGCONNECT_TIMEOUT": "10"}
    command = [str(server.bin / "psql"), "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(proxy.port), "-U", ROLE,
               "-d", DATABASE, "-c", query]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def test_the_directory_and_its_relay_cut_stall_restore_and_restart():
    server = Postgres().start()
    directory = server.dir
    proxy = Proxy(server.port)
    try:
        r = through(server, proxy, "CREATE TABLE t (n int); INSERT INTO t VALUES (1); SELECT count(*) FROM t")
        assert (r.returncode, r.stdout.strip()) == (0, "1"), r.stderr
        # Over TCP the role needs its password.
        r = through(server, proxy, "SELECT 1", password="wrong")
        assert r.returncode != 0 and "password authentication failed" in r.stderr

        # Cut: an open session is dropped, a new one refused.
        session = subprocess.Popen(
            [str(server.bin / "psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(proxy.port), "-U", ROLE, "-d",
             DATABASE, "-c", "SELECT pg_sleep(30)"],
            env={"PATH": "/usr/bin:/bin", "PGPASSWORD": server.password}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while proxy.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.cut()
        assert session.wait(timeout=20) != 0
        r = through(server, proxy, "SELECT 1")
        assert r.returncode != 0 and "refused" in r.stderr, r.stderr
        proxy.restore()
        assert through(server, proxy, "SELECT 1").stdout.strip() == "1"

        # Stall: on an open session, the statement reaches the server and commits; its answer
        # never comes back.
        session = subprocess.Popen(
            [str(server.bin / "psql"), "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(proxy.port), "-U", ROLE, "-d",
             DATABASE],
            env={"PATH": "/usr/bin:/bin", "PGPASSWORD": server.password}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        session.stdin.write("SELECT 'ready';\n")
        session.stdin.flush()
        assert session.stdout.readline().strip() == "ready"
        proxy.stall()
        session.stdin.write("INSERT INTO t VALUES (2) RETURNING 'inserted';\n")
        session.stdin.flush()
        deadline = time.monotonic() + 30
        while server.scalar("SELECT count(*) FROM t") != "2" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.scalar("SELECT count(*) FROM t") == "2"
        time.sleep(1)
        assert proxy.connections == 1 and session.poll() is None  # still waiting for the answer
        proxy.restore()  # the held answer is dropped with its connection
        session.stdin.close()
        out = session.stdout.read()
        session.wait(timeout=20)
        assert "inserted" not in out
        assert through(server, proxy, "SELECT count(*) FROM t").stdout.strip() == "2"

        # Restart: the committed rows survive; the relay reaches the server again.
        server.restart()
        assert through(server, proxy, "SELECT count(*) FROM t").stdout.strip() == "2"
        assert b"CREATE TABLE public.t" in server.dump()
    finally:
        proxy.close()
        server.stop()
    assert not os.path.exists(directory)
