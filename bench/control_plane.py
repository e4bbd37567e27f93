#!/usr/bin/env python3
"""Control-plane throughput and latency, and passcode unlocks under load.

Starts kioskauthd ($KIOSKAUTH_BIN_DIR, default .build/debug; measure a release build) with the
daemon's default Argon2id cost, and prints, in one run:

- GetStatus with --connections connections (closed loop, one call in flight per connection,
  spread over --processes client processes): requests per second and p50/p99 latency;
- the same with --pipeline calls in flight per connection (pipelined on one connection);
- a passcode unlock (VerifyPasscode, right passcode) timed one at a time: idle, while the
  GetStatus load runs, and while a passcode storm runs (--storm clients sending passcodes as
  fast as they are answered); p50/p99 and how many were refused `Busy`;
- GetStatus latency (p50/p99, one connection) idle and during the storm.

Client and daemon share the machine: compare figures within one run (e.g. two builds back to
back with --bin-dirs A,B), not across runs.

    KIOSKAUTH_BIN_DIR=.build/release python3 bench/control_plane.py [--seconds 5]
    python3 bench/control_plane.py --bin-dirs .build-base/build/release,.build/release
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

PASSCODE = "482913"
STATUS = json.dumps({"method": "io.kioskauth.GetStatus"}).encode() + b"\0"
CONFIG = "[Fingerprint]\nEnabled=no\n"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def status_load(path: str, connections: int, pipeline: int, seconds: float, queue) -> None:
    """One client process: `connections` connections, `pipeline` GetStatus calls in flight on
    each, for `seconds`; puts (answered, latencies in ms) on `queue`."""
    selector = selectors.DefaultSelector()
    sent_at: dict[int, list[float]] = {}
    buffers: dict[int, bytes] = {}
    socks = []
    for _ in range(connections):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.setblocking(False)
        socks.append(s)
        sent_at[s.fileno()] = []
        buffers[s.fileno()] = b""
        selector.register(s, selectors.EVENT_READ)
    latencies: list[float] = []
    answered = 0
    start = time.perf_counter()
    end = start + seconds
    for s in socks:
        now = time.perf_counter()
        s.sendall(STATUS * pipeline)
        sent_at[s.fileno()].extend([now] * pipeline)
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        for key, _ in selector.select(timeout=end - now):
            s = key.fileobj
            fd = s.fileno()
            data = s.recv(1 << 16)
            if not data:
                raise SystemExit("the daemon closed a connection")
            buffers[fd] += data
            replies = buffers[fd].count(b"\0")
            if not replies:
                continue
            buffers[fd] = buffers[fd].rsplit(b"\0", 1)[1]
            now = time.perf_counter()
            times = sent_at[fd]
            for sent in times[:replies]:
                latencies.append((now - sent) * 1000)
            del times[:replies]
            answered += replies
            if now < end:
                s.sendall(STATUS * replies)
                times.extend([now] * replies)
    elapsed = time.perf_counter() - start
    for s in socks:
        s.close()
    queue.put((answered / elapsed, latencies))


def run_status_load(path: str, connections: int, processes: int, pipeline: int, seconds: float):
    queue = multiprocessing.Queue()
    per = [connections // processes + (1 if i < connections % processes else 0) for i in range(processes)]
    workers = [multiprocessing.Process(target=status_load, args=(path, n, pipeline, seconds, queue)) for n in per]
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 60) for _ in workers]
    for w in workers:
        w.join()
    rate = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    return rate, latencies


def call(s: socket.socket, method: str, parameters: dict | None = None) -> dict:
    message = {"method": "io.kioskauth." + method}
    if parameters is not None:
        message["parameters"] = parameters
    s.sendall(json.dumps(message).encode() + b"\0")
    data = b""
    while not data.endswith(b"\0"):
        chunk = s.recv(1 << 16)
        if not chunk:
            raise SystemExit("the daemon closed a connection")
        data += chunk
    return json.loads(data[:-1])


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def time_unlocks(path: str, runs: int, pause: float = 0.05) -> tuple[list[float], int]:
    s = connect(path)
    samples, busy = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        reply = call(s, "VerifyPasscode", {"name": "sarah", "passcode": PASSCODE})
        elapsed = (time.perf_counter() - started) * 1000
        if reply.get("error", "").endswith(".Busy"):
            busy += 1
        elif "error" in reply:
            raise SystemExit(f"unlock failed: {reply}")
        else:
            samples.append(elapsed)
        time.sleep(pause)
    s.close()
    return samples, busy


def time_status(path: str, runs: int, pause: float = 0.002) -> list[float]:
    s = connect(path)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call(s, "GetStatus")
        samples.append((time.perf_counter() - started) * 1000)
        time.sleep(pause)
    s.close()
    return samples


class Storm:
    """`clients` threads, each on its own connection, unlocking stormN as fast as answered."""

    def __init__(self, path: str, clients: int):
        self.stop = threading.Event()
        self.answered = self.busy = 0
        self.threads = [threading.Thread(target=self.run, args=(path, i)) for i in range(clients)]

    def run(self, path: str, index: int) -> None:
        s = connect(path)
        while not self.stop.is_set():
            reply = call(s, "VerifyPasscode", {"name": f"storm{index}", "passcode": PASSCODE})
            if reply.get("error", "").endswith(".Busy"):
                self.busy += 1
                time.sleep(reply["parameters"].get("retryAfter", 0.01))
            elif "error" in reply:
                raise SystemExit(f"storm unlock failed: {reply}")
            else:
                self.answered += 1
        s.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def line(label: str, samples: list[float], extra: str = "") -> None:
    print(f"  {label:<44} n={len(samples):>6}  p50 {statistics.median(samples) if samples else float('nan'):8.2f} ms"
          f"  p99 {percentile(samples, 0.99):8.2f} ms  {extra}", flush=True)


def bench(bin_dir: str, args) -> None:
    os.environ["KIOSKAUTH_BIN_DIR"] = bin_dir
    import importlib

    import kioskauth_testing

    importlib.reload(kioskauth_testing)
    daemon = kioskauth_testing.Daemon(config=CONFIG).start(timeout=120)
    try:
        path = daemon.socket
        people = ["sarah"] + [f"storm{i}" for i in range(args.storm)]
        s = connect(path)
        for name in people:
            for method, parameters in (
                ("AddPerson", {"name": name, "displayName": name.title(), "roles": ["caregiver"]}),
                ("SetPasscode", {"name": name, "passcode": PASSCODE, "confirmation": PASSCODE}),
            ):
                reply = call(s, method, parameters)
                assert "error" not in reply, reply
        s.close()
        print(f"{bin_dir}", flush=True)
        rate, latencies = run_status_load(path, args.connections, args.processes, 1, args.seconds)
        line(f"GetStatus, {args.connections} connections", latencies, f"{rate:9.0f} req/s")
        rate, latencies = run_status_load(path, args.connections, args.processes, args.pipeline, args.seconds)
        line(f"GetStatus, {args.connections} conn x {args.pipeline} pipelined", latencies, f"{rate:9.0f} req/s")
        samples, busy = time_unlocks(path, args.unlocks)
        line("unlock, idle", samples, f"busy {busy}")
        status_idle = time_status(path, args.status_runs)
        line("GetStatus one at a time, idle", status_idle)
        # Unlocks while the GetStatus load runs in other processes.
        loader = threading.Thread(
            target=run_status_load, args=(path, args.connections, args.processes, 1, args.seconds + 2))
        loader.start()
        time.sleep(1)
        samples, busy = time_unlocks(path, max(10, args.unlocks // 2))
        loader.join()
        line(f"unlock, GetStatus load ({args.connections} conn)", samples, f"busy {busy}")
        with Storm(path, args.storm) as storm:
            samples, busy = time_unlocks(path, args.unlocks)
            status = time_status(path, args.status_runs)
        line(f"unlock, passcode storm ({args.storm} clients)", samples, f"busy {busy}")
        line(f"GetStatus one at a time, passcode storm", status,
             f"storm answered {storm.answered}, busy {storm.busy}")
    finally:
        daemon.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dirs", default=os.environ.get("KIOSKAUTH_BIN_DIR", ".build/debug"),
                        help="comma-separated build directories to measure one after the other")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--pipeline", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--unlocks", type=int, default=40)
    parser.add_argument("--status-runs", type=int, default=500)
    parser.add_argument("--storm", type=int, default=8)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{os.cpu_count()} cores", flush=True)
    for bin_dir in args.bin_dirs.split(","):
        bench(str(Path(bin_dir).resolve()), args)


if __name__ == "__main__":
    main()
