#!/usr/bin/env python3
"""Load on one fleet directory from many simulated terminals (docs/fleet.md §10).

Starts its own PostgreSQL (initdb into a temporary directory, Unix socket only, run as `nobody`
when started as root), applies the schema from Sources/KioskAuthFleetDirectory/Schema/ (every migration),
and simulates --terminals logical terminals over a pool of --pool connections. This is a load
generator, not that many daemons. Each terminal has its own database role (a member of
kioskauth_terminal, as docs/fleet.md §6 provisions them); the pool connects as the superuser and
switches to the terminal's role with SET SESSION AUTHORIZATION before each of its calls, so the
SECURITY DEFINER functions see that terminal as session_user (one extra round trip per call, not
inside the timed statements). Each terminal:

* pulls the change feed from its cursor every --poll seconds (phases spread at random), and
  records its cursor when it moved;
* pushes a batch every --push seconds through fleet_apply_push: an audit event, a passcode
  failure in one batch out of 10, and a sealed 2 KiB template in one batch out of 50.

A probe pushes a marker once a second. A LISTENing connection pulls when woken, and the probe
times push → visible to that pull (the propagation delay). It prints the directory's CPU (utime
+ stime of every postgres process from /proc, divided by wall time), the pull and push latency
p50/p99 as the client sees it, the rates achieved and the propagation p50/p99.

    .build-venv/bin/python bench/fleet_scale.py [--terminals 1000,10000] [--duration 30]
        [--poll 30] [--push 60] [--pool 16]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pwd
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

REPO = Path(__file__).resolve().parent.parent
MIGRATIONS = [REPO / "Sources/KioskAuthFleetDirectory/Schema/Migrations.swift",
              REPO / "Sources/KioskAuthFleetDirectory/Schema/MigrationV2.swift"]
SQL_START = ("INSERT", "CREATE", "ALTER", "GRANT", "REVOKE", "DO")
CHANNEL = "kioskauth_fleet_changes"
PULL = (
    "SELECT change_id, entity, entity_key, deleted, body::text FROM changes "
    "WHERE change_id > $1 ORDER BY change_id LIMIT 1000"
)
PUSH = "SELECT fleet_apply_push($1::uuid, $2::uuid, $3::jsonb)"


def statements() -> list[str]:
    """The migrations' statements, read from the Swift source (one source of truth)."""
    found: list[str] = []
    for path in (p for p in MIGRATIONS if p.exists()):
        source = path.read_text()
        body = source[source.index("statements: [") :]
        for match in re.finditer(r'"""\n(.*?)\n(\s*)"""|"((?:[^"\\\n]|\\.)*)"', body, re.S):
            if match.group(1) is not None:
                indent = match.group(2)
                lines = [line[len(indent) :] if line.startswith(indent) else line
                         for line in match.group(1).split("\n")]
                found.append("\n".join(lines).replace("\\\\", "\\"))
            elif match.group(3) and match.group(3).lstrip().upper().startswith(SQL_START):
                found.append(match.group(3))
    return found


def versions() -> int:
    return sum(1 for p in MIGRATIONS if p.exists())


def pg_bin() -> Path:
    root = Path("/usr/lib/postgresql")
    versions = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()), reverse=True) if root.exists() else []
    for version in versions:
        if (root / str(version) / "bin/initdb").exists():
            return root / str(version) / "bin"
    sys.exit("fleet_scale: PostgreSQL is not installed (scripts/install-deps)")


class Server:
    def __init__(self) -> None:
        self.bin = pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="kioskauth-fleet-bench-"))
        self.user = "nobody" if os.getuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.port = 5432

    def run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.user:
            entry = pwd.getpwnam(self.user)
            command = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *command]
        subprocess.run(command, check=True, cwd=self.dir, capture_output=True, env={**os.environ, "LC_ALL": "C"})

    def start(self) -> None:
        data = str(self.dir / "data")
        self.run("initdb", "-D", data, "-U", "fleet", "--auth=trust", "-E", "UTF8")
        options = (
            f"-k {self.dir} -c listen_addresses= -p {self.port} -c max_connections=100"
            " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
            # One entry per (statement, role): room for every terminal's role.
            " -c pg_stat_statements.max=40000 -c pg_stat_statements.track_utility=off"
        )
        self.run("pg_ctl", "-D", data, "-l", str(self.dir / "server.log"), "-w", "-o", options, "start")

    def stop(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def cpu_seconds(self) -> float:
        """utime + stime of the postmaster and every process it started."""
        postmaster = int((self.dir / "data/postmaster.pid").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(entry.name), int(fields[1])
            if pid == postmaster or ppid == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / ticks

    def dsn(self) -> dict:
        return {"host": str(self.dir), "port": self.port, "user": "fleet", "database": "postgres"}


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def prepare(server: Server, terminals: int, people: int) -> tuple[list[str], list[str]]:
    connection = await asyncpg.connect(**server.dsn())
    try:
        async with connection.transaction():
            await connection.execute(
                "CREATE TABLE fleet_schema (version integer PRIMARY KEY, summary text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for statement in statements():
                await connection.execute(statement)
            for version in range(1, versions() + 1):
                await connection.execute("INSERT INTO fleet_schema (version, summary) VALUES ($1, 'bench')", version)
            # One role per terminal, as an admin provisions them (docs/fleet.md §6).
            await connection.execute(
                f"DO $$ BEGIN FOR i IN 0..{terminals - 1} LOOP "
                "EXECUTE format('CREATE ROLE %I IN ROLE kioskauth_terminal', 'kt' || i); END LOOP; END $$")
        terminal_ids = [str(uuid.uuid4()) for _ in range(terminals)]
        await connection.copy_records_to_table(
            "terminals",
            records=[(uuid.UUID(t), f"t{i}", os.urandom(32), "virtual_image", "image", "member", role(i))
                     for i, t in enumerate(terminal_ids)],
            columns=["terminal_id", "name", "public_key", "reader_driver", "reader_device_type", "state", "db_role"],
        )
        await connection.execute("INSERT INTO data_keys (generation, reason) VALUES (1, 'bench')")
        person_ids = [str(uuid.uuid4()) for _ in range(people)]
        operations = [{"op": "person", "person": p, "name": f"person-{i}", "role": "user", "state": "active",
                       **row_mac()} for i, p in enumerate(person_ids)]
        await act_as(connection, 0)
        await connection.fetchval(PUSH, str(uuid.uuid4()), terminal_ids[0], json.dumps(operations))
        await connection.execute("RESET SESSION AUTHORIZATION")
        await connection.execute("VACUUM ANALYZE")
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await connection.execute("SELECT pg_stat_statements_reset()")
        return terminal_ids, person_ids
    finally:
        await connection.close()


def role(index: int) -> str:
    return f"kt{index}"


async def act_as(connection, index: int) -> None:
    """Makes the terminal's role the session user, as if it had logged in itself."""
    await connection.execute(f'SET SESSION AUTHORIZATION "{role(index)}"')


def row_mac() -> dict:
    """A version and a row MAC as a member sends them. The directory stores MACs and never
    checks them (it has no key), so random bytes cost it what real ones do; members compute and
    verify them, one HMAC-SHA256 per row, on their own CPU."""
    return {"generation": "1", "version": str(time.time_ns() // 1000),
            "mac": base64.b64encode(os.urandom(32)).decode()}


def batch(people: list[str], n: int) -> str:
    operations = [{
        "op": "audit", "key": str(uuid.uuid4()), "sequence": str(n),
        "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "person": "person", "action": "VerifyFinger", "result": "ok",
    }]
    if n % 10 == 0:
        operations.append({"op": "passcode_failures", "person": random.choice(people), "count": "1"})
    if n % 50 == 0:
        operations.append({
            "op": "template", "template": str(uuid.uuid4()), "person": random.choice(people),
            "finger": "right-index", "driver": "virtual_image", "device_type": "image", "generation": "1",
            "sealed": base64.b64encode(os.urandom(2048)).decode(), **row_mac(),
        })
    return json.dumps(operations)


async def run_size(server: Server, terminals: int, args: argparse.Namespace) -> dict:
    terminal_ids, people = await prepare(server, terminals, args.people)
    pool = await asyncpg.create_pool(**server.dsn(), min_size=args.pool, max_size=args.pool)
    head = await pool.fetchval("SELECT last_id FROM change_clock")
    pulls: list[float] = []
    pushes: list[float] = []
    propagation: list[float] = []
    errors = 0
    deadline = time.monotonic() + args.duration

    async def terminal(index: int) -> None:
        nonlocal errors
        me = terminal_ids[index]
        cursor = head
        next_pull = time.monotonic() + random.uniform(0, args.poll)
        next_push = time.monotonic() + random.uniform(0, args.push)
        n = 0
        while True:
            wake = min(next_pull, next_push)
            if wake >= deadline:
                return
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            try:
                if next_pull <= next_push:
                    next_pull += args.poll
                    async with pool.acquire() as connection:
                        await act_as(connection, index)
                        started = time.perf_counter()
                        rows = await connection.fetch(PULL, cursor)
                        while len(rows) == 1000:
                            cursor = rows[-1]["change_id"]
                            rows = await connection.fetch(PULL, cursor)
                        if rows:
                            cursor = rows[-1]["change_id"]
                            await connection.execute("SELECT fleet_record_cursor($1::uuid, $2)", me, cursor)
                        pulls.append(time.perf_counter() - started)
                else:
                    next_push += args.push
                    n += 1
                    operations = batch(people, n)
                    async with pool.acquire() as connection:
                        await act_as(connection, index)
                        started = time.perf_counter()
                        await connection.fetchval(PUSH, str(uuid.uuid4()), me, operations)
                        pushes.append(time.perf_counter() - started)
            except Exception as error:  # counted, not fatal: the figures say how many failed
                errors += 1
                if errors <= 3:
                    print(f"  error: {error!r}", file=sys.stderr)

    async def probe() -> None:
        listener = await asyncpg.connect(**server.dsn())
        pusher = await asyncpg.connect(**server.dsn())
        await act_as(pusher, 0)
        woken = asyncio.Event()
        await listener.add_listener(CHANNEL, lambda *_: woken.set())
        cursor = await listener.fetchval("SELECT last_id FROM change_clock")
        try:
            while time.monotonic() < deadline - 1:
                marker = str(uuid.uuid4())
                operations = json.dumps([{"op": "person", "person": marker, "name": marker, "role": "probe",
                                          "state": "active", **row_mac()}])
                sent = time.perf_counter()
                await pusher.fetchval(PUSH, str(uuid.uuid4()), terminal_ids[0], operations)
                seen = False
                while not seen:
                    try:
                        await asyncio.wait_for(woken.wait(), timeout=5)
                    except asyncio.TimeoutError:
                        break
                    woken.clear()
                    rows = await listener.fetch(PULL, cursor)
                    while rows:
                        cursor = rows[-1]["change_id"]
                        seen = seen or any(r["entity_key"] == marker for r in rows)
                        rows = await listener.fetch(PULL, cursor) if len(rows) == 1000 else []
                if seen:
                    propagation.append(time.perf_counter() - sent)
                await asyncio.sleep(1)
        finally:
            await listener.close()
            await pusher.close()

    cpu_before = server.cpu_seconds()
    wall_before = time.monotonic()
    load_before = os.getloadavg()[0]
    await asyncio.gather(probe(), *(terminal(i) for i in range(terminals)))
    wall = time.monotonic() - wall_before
    cpu = server.cpu_seconds() - cpu_before
    load_after = os.getloadavg()[0]
    # On a connection of its own: the pool's connections act as terminal roles, which may not
    # read other roles' statistics.
    stats = await asyncpg.connect(**server.dsn())
    server_side = await stats.fetch(
        "SELECT query, sum(calls) AS calls, sum(total_exec_time) / sum(calls) AS mean_exec_time, "
        "max(max_exec_time) AS max_exec_time FROM pg_stat_statements "
        "WHERE query LIKE '%FROM changes%' OR query LIKE '%fleet_apply_push%' "
        "GROUP BY query ORDER BY sum(calls) DESC LIMIT 2")
    await stats.close()
    await pool.close()
    return {
        "terminals": terminals, "wall": wall, "cpu": cpu, "pulls": pulls, "pushes": pushes,
        "propagation": propagation, "errors": errors, "load": (load_before, load_after),
        "server": [("pull" if "changes" in r["query"] else "push", r["calls"], r["mean_exec_time"], r["max_exec_time"])
                   for r in server_side],
    }


def report(result: dict, args: argparse.Namespace) -> None:
    ms = lambda seconds: f"{seconds * 1000:.1f}"  # noqa: E731
    wall = result["wall"]
    print(f"terminals={result['terminals']} poll={args.poll}s push={args.push}s pool={args.pool} "
          f"duration={wall:.1f}s (load average {result['load'][0]:.1f} -> {result['load'][1]:.1f})")
    print(f"  directory CPU: {result['cpu']:.1f} s over {wall:.1f} s = {result['cpu'] / wall:.2f} cores")
    for name in ("pulls", "pushes"):
        values = result[name]
        print(f"  {name}: {len(values)} ({len(values) / wall:.0f}/s), client-side on the connection: p50 {ms(percentile(values, 50))} ms, "
              f"p99 {ms(percentile(values, 99))} ms")
    for name, calls, mean, longest in result["server"]:
        print(f"  server-side {name} (pg_stat_statements): {calls} calls, mean {mean:.2f} ms, max {longest:.1f} ms")
    values = result["propagation"]
    print(f"  propagation push -> visible to a woken pull: n={len(values)} p50 {ms(percentile(values, 50))} ms, "
          f"p99 {ms(percentile(values, 99))} ms; a polling terminal adds up to {args.poll} s")
    print(f"  errors: {result['errors']}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--terminals", default="1000,10000")
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--poll", type=float, default=30)
    parser.add_argument("--push", type=float, default=60)
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--people", type=int, default=2000)
    args = parser.parse_args()
    for size in (int(s) for s in args.terminals.split(",")):
        server = Server()
        try:
            server.start()
            report(await run_size(server, size, args), args)
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
