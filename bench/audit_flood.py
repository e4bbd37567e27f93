#!/usr/bin/env python3
"""An unprivileged uid floods the socket with refused calls; what does it cost the store and a
concurrent unlock?

Starts a debug kioskauthd (.build/debug, or $KIOSKAUTH_BIN_DIR) with the tests' cheap Argon2id,
adds one person with a passcode, then for --seconds runs, at the same time:

  flood    --rate calls a second from uid 65534 (nobody), paced, over --connections pipelining
           connections, of methods nobody is refused (ListPeople, RemovePerson): each refusal is
           audited (one durable row each before issue #11; a per-uid summary after, with a
           rate limit in front)
  unlock   VerifyPasscode as root on its own connection, back to back

and prints the refused calls sent and their replies, the growth of the state directory
(database + WAL) in bytes, the audit entries added, and the unlock latency (p50/p99) during the
flood next to a quiet baseline. A harness that prints figures, not a test.

    python3 bench/audit_flood.py [--rate 1400] [--seconds 10]
    KIOSKAUTH_BIN_DIR=/path/to/other/.build/debug python3 bench/audit_flood.py   # compare builds
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHD, Daemon, as_user  # noqa: E402

FLOODER = """
import json, socket, sys, threading, time
path, rate, seconds, connections = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
calls = [json.dumps({"method": m, "parameters": p}).encode() + b"\\0" for m, p in
         [("io.kioskauth.ListPeople", {}), ("io.kioskauth.RemovePerson", {"name": "omar"})]]
sent, replies = [0], {}
lock = threading.Lock()
def reader(s):
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        *messages, buf = buf.split(b"\\0")
        with lock:
            for m in messages:
                name = json.loads(m).get("error", "ok").rsplit(".", 1)[-1]
                replies[name] = replies.get(name, 0) + 1
socks = []
for _ in range(connections):
    s = socket.socket(socket.AF_UNIX); s.connect(path); socks.append(s)
    threading.Thread(target=reader, args=(s,), daemon=True).start()
start = time.monotonic()
tick = 0.01
while time.monotonic() - start < seconds:
    due = int((time.monotonic() - start) * rate)
    while sent[0] < due:
        try:
            socks[sent[0] % connections].sendall(calls[sent[0] % 2])
        except OSError:
            pass
        sent[0] += 1
    time.sleep(tick)
time.sleep(1.0)
with lock:
    print(json.dumps({"sent": sent[0], "replies": replies}), flush=True)
"""


def call(s: socket.socket, method: str, parameters: dict) -> dict:
    s.sendall(json.dumps({"method": method, "parameters": parameters}).encode() + b"\0")
    buf = b""
    while not buf.endswith(b"\0"):
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("daemon closed the connection")
        buf += chunk
    return json.loads(buf[:-1])


def store_bytes(d: Daemon) -> int:
    return sum(p.stat().st_size for p in d.state.iterdir() if p.is_file())


def unlocks(path: str, stop: threading.Event, samples: list[float]) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    while not stop.is_set():
        started = time.perf_counter()
        reply = call(s, "io.kioskauth.VerifyPasscode", {"name": "omar", "passcode": "593024"})
        samples.append((time.perf_counter() - started) * 1000)
        assert "error" not in reply, reply


def audit_events(d: Daemon) -> list[dict]:
    events: list[dict] = []
    while True:
        r = d.ctl("audit", "--json", "--after", str(events[-1]["sequence"] if events else 0), "--limit", "1000")
        page = json.loads(r.stdout)["events"]
        if not page:
            return events
        events += page


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1400, help="refused calls a second from nobody")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    if not KIOSKAUTHD.exists():
        print(f"{KIOSKAUTHD} is not built (swift build)", file=sys.stderr)
        return 2
    d = Daemon(config=FAST_HASH_CONFIG).start()
    try:
        for cmd, text in ((["user", "add", "omar"], None), (["passcode", "set", "omar"], "593024\n593024\n")):
            r = d.ctl(*cmd, input=text)
            assert r.returncode == 0, r.stderr
        quiet: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=unlocks, args=(d.socket, stop, quiet))
        t.start()
        time.sleep(3)
        stop.set()
        t.join()

        def flood() -> dict:
            r = subprocess.run(
                as_user([sys.executable, "-c", FLOODER, d.socket, str(args.rate), str(args.seconds),
                         str(args.connections)], "nobody"), capture_output=True, text=True, timeout=args.seconds + 60)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
            return json.loads(r.stdout)

        # 1. The flood alone: what it costs the store (sizes after a stop, which checkpoints).
        d.stop()
        bytes_before = store_bytes(d)
        d.start()
        audit_before = len(audit_events(d))
        alone = flood()
        d.stop()  # flushes any pending summary
        bytes_after = store_bytes(d)
        d.start()
        added = audit_events(d)[audit_before:]
        from_flood = sum(1 for e in added if e.get("callerUid") == 65534)

        # 2. The flood with unlocks alongside: what it costs them.
        loaded: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=unlocks, args=(d.socket, stop, loaded))
        t.start()
        try:
            beside = flood()
        finally:
            stop.set()
            t.join()

        print(f"binary:            {KIOSKAUTHD}")
        for label, result in (("flood alone", alone), ("flood + unlocks", beside)):
            print(f"{label + ':':18} {result['sent']} refused calls in {args.seconds:g} s from uid 65534 "
                  f"({args.rate:g}/s over {args.connections} connections); replies "
                  f"{json.dumps(result['replies'], sort_keys=True)}")
        print(f"store growth:      {bytes_after - bytes_before} bytes (flood alone, database + WAL after a stop)")
        print(f"audit entries:     {from_flood} from uid 65534 (flood alone), {len(added) - from_flood} others "
              "(daemon stop/start)")
        for label, samples in (("unlock, quiet", quiet), ("unlock, flooded", loaded)):
            print(f"{label + ':':18} n={len(samples)} p50={statistics.median(samples):.1f} ms "
                  f"p99={percentile(samples, 0.99):.1f} ms")
    finally:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
