#!/usr/bin/env python3
"""A live-socket fuzzer: mutated varlink calls against a running kioskauthd.

The valid calls come from the daemon's own interface description (GetInterfaceDescription):
every method, its input fields filled with values of their declared types. Each frame is one of
them, mutated: bytes flipped, inserted, deleted or repeated, the message cut short, a NUL put
inside, a field's value swapped for another type, deep nesting, long strings, unknown methods,
`more`/`oneway` set at random. Workers send them over many connections (a few frames pipelined
on each, replies read but not waited for long) as root and, under setpriv, as an unprivileged uid.
After the frames, a burst of connections (100) each holds an unfinished call of 60,000 bytes, all
buffered by the daemon at once, and closes.

Meanwhile the driver counts
  crashes  the daemon process exited;
  hangs    a GetStatus on a fresh connection, sent every half second, did not answer within 2 s;
  RSS      VmRSS and RssAnon of the daemon from /proc/PID/status, after the warm-up and at the end
           (each after a quiet 3 s).

`run(daemon, frames=..., ...)` is what tests/test_socket_fuzz.py and bench/socket_fuzz.py call;
`python3 socket_fuzz.py worker SOCKET INTERFACE-FILE SEED FRAMES ROLE` is one worker (so that it
can run as another uid), printing the frames it sent as one JSON line.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()

# Methods root's workers call: everything that does not add to the store's people, fingers or
# sessions on purpose (those would grow the daemon's state legitimately, hiding a leak). The
# unprivileged worker calls every method; the daemon refuses what it may not do.
ROOT_METHODS = {
    "GetStatus", "ListPeople", "GetPerson", "VerifyPasscode", "GetAudit", "VerifyAudit", "GetReaders",
    "ListFingers", "VerifyFinger", "Identify", "CheckActivationCode", "CheckAccount", "CheckOnlineLogin",
    "GetConnectivity", "ListSessions", "GetSessionToken", "ExportPerson",
}
NAMES = ["sarah", "omar", "nobody", "root", "", "ghost", "a" * 64, "Sarah", "s@r.ah", "x" * 300]
STRINGS = NAMES + ["482913", "000000", "right-index-finger", "2026-01-02T03:04:05Z", "\u00c5\U0001F600", "\\", "\x01"]


def parse_interface(description: str) -> dict[str, list[tuple[str, str]]]:
    """Method name -> [(field, type)] from a varlink interface description."""
    text = re.sub(r"#[^\n]*", "", description)
    methods = {}
    for match in re.finditer(r"method\s+(\w+)\s*\((.*?)\)\s*->", text, re.S):
        fields = []
        for part in match.group(2).split(","):
            if ":" in part:
                name, kind = part.split(":", 1)
                fields.append((name.strip(), kind.strip()))
        methods[match.group(1)] = fields
    return methods


def value_of(kind: str, rng: random.Random, depth: int = 0):
    if kind.startswith("?"):
        return None if rng.random() < 0.2 else value_of(kind[1:], rng, depth)
    if kind.startswith("[]"):
        return [value_of(kind[2:], rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "int":
        return rng.choice([0, 1, -1, 30, 2**31, 2**53, 10**30])
    if kind == "float":
        return rng.choice([0.5, -1e308, 1e-300])
    if kind == "bool":
        return rng.random() < 0.5
    if kind.startswith("("):  # an enum or an inline struct
        names = [p.split(":")[0].strip() for p in kind.strip("()").split(",")]
        return rng.choice(names) if ":" not in kind else {}
    # A named type (CallerContext, ...): a plausible caller context, or nothing much.
    return {"service": "login", "tty": "tty1"} if depth == 0 and rng.random() < 0.7 else {}


def valid_call(methods, names, rng):
    method = rng.choice(names)
    params = {}
    for field, kind in methods[method]:
        value = value_of(kind, rng)
        if value is not None or rng.random() < 0.5:
            params[field] = value
    call = {"method": "io.kioskauth." + method, "parameters": params}
    if rng.random() < 0.2:
        call["more"] = True
    if rng.random() < 0.05:
        call["oneway"] = True
    return call


def mutate_json(call, rng):
    call = json.loads(json.dumps(call))
    choice = rng.randrange(8)
    params = call.setdefault("parameters", {})
    if choice == 0 and params:
        key = rng.choice(list(params))
        params[key] = rng.choice([None, 7, -1.5, True, [], {}, "z" * rng.randrange(1, 5000), [[[]]]])
    elif choice == 1:
        params["unknown%d" % rng.randrange(1000)] = rng.choice(STRINGS)
    elif choice == 2:
        call["method"] = rng.choice(["io.kioskauth.Nope%d" % rng.randrange(10**6), "", "org.varlink.service.GetInfo",
                                     "x" * rng.randrange(1, 2000), call["method"] + "\u0000"])
    elif choice == 3:
        nested = "leaf"
        for _ in range(rng.choice([10, 100, 127, 129, 500])):
            nested = [nested]
        params["deep"] = nested
    elif choice == 4:
        call["parameters"] = rng.choice([[], "s", 1, None])
    elif choice == 5:
        call["upgrade"] = True
    elif choice == 6:
        del call["method"]
    return call


def mutate_bytes(data: bytes, rng) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos:pos] = bytes([rng.choice(b'{}[]",:\\ 0-e.\xff\xc3\x80')]) * rng.randrange(1, 4)
        elif op == 2 and b:
            del b[pos:pos + rng.randrange(1, 8)]
        elif op == 3:
            b = b[:pos]
        elif op == 4 and b:
            chunk = b[pos:pos + rng.randrange(1, 40)]
            b[pos:pos] = chunk * rng.randrange(1, 50)
        elif op == 5:
            b[pos:pos] = rng.choice([b'\\u0000', b'\\ud800', b'1e99999', b'-0', b'"\\uDC00"', b'\x00'])
        elif op == 6:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    return bytes(b)


def frame(methods, names, rng) -> bytes:
    call = valid_call(methods, names, rng)
    if rng.random() < 0.5:
        call = mutate_json(call, rng)
    data = json.dumps(call, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if rng.random() < 0.6:
        data = mutate_bytes(data, rng)
    return data + b"\0"


def worker(socket_path: str, interface_file: str, seed: int, frames: int, role: str) -> int:
    methods = parse_interface(Path(interface_file).read_text())
    names = sorted(methods) if role != "root" else sorted(m for m in methods if m in ROOT_METHODS)
    rng = random.Random(seed)
    sent = refused = 0
    replies: dict[str, int] = {}
    while sent < frames:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(socket_path)
            for _ in range(rng.randrange(1, 8)):
                s.sendall(frame(methods, names, rng))
                sent += 1
            # Read what comes back for a moment; a reply may take a while (a scan, a hash).
            s.settimeout(0.05 if rng.random() < 0.8 else 0.5)
            pending = b""
            while chunk := s.recv(65536):
                pending += chunk
                *messages, pending = pending.split(b"\0")
                for message in messages:
                    try:
                        name = json.loads(message).get("error") or "reply"
                    except ValueError:
                        name = "unparseable reply"
                    replies[name] = replies.get(name, 0) + 1
        except (socket.timeout, TimeoutError):
            pass
        except OSError:
            refused += 1
            time.sleep(0.01)
        finally:
            s.close()
    print(json.dumps({"sent": sent, "refused": refused, "replies": replies}), flush=True)
    return 0


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A figure from /proc/PID/status in KiB: VmRSS, or RssAnon (the heap, arenas and stacks:
    what the daemon's own allocations can grow; the rest is its mapped binary and libraries)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def probe(socket_path: str, deadline: float = 2.0) -> float | None:
    """Seconds a GetStatus took on a fresh connection; None when it did not answer in time."""
    start = time.monotonic()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(deadline)
        s.connect(socket_path)
        s.sendall(b'{"method":"io.kioskauth.GetStatus"}\0')
        buf = b""
        while b"\0" not in buf:
            if time.monotonic() - start > deadline:
                return None
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
        s.close()
        reply = json.loads(buf.split(b"\0")[0])
        return time.monotonic() - start if "error" not in reply else None
    except (OSError, ValueError):
        return None


def large_frames(socket_path: str, connections: int, size: int, hold: float = 1.0) -> int:
    """Opens `connections` connections at once, each sending `size` bytes of one call that never
    ends (no NUL), holds them for `hold` seconds and closes them: the daemon buffers every one of
    them at the same time. Returns the connections that got their bytes in."""
    socks = []
    payload = b'{"method":"io.kioskauth.GetStatus","parameters":{"x":"' + b"a" * size
    try:
        for _ in range(connections):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(socket_path)
                s.sendall(payload)
            except OSError:
                s.close()
                continue
            socks.append(s)
        time.sleep(hold)
        return len(socks)
    finally:
        for s in socks:
            s.close()


def run(daemon, frames: int, warmup: int, workers_root: int = 2, workers_user: int = 2, user: str = "nobody",
        seed: int = 1, large_connections: int = 100, large_size: int = 60_000, log=lambda *a: None) -> dict:
    """Fuzzes `daemon` (a tests/kioskauth_testing.Daemon, running) with `warmup` frames, takes
    its RSS, then `frames` more and a burst of `large_connections` connections each holding
    `large_size` bytes of an unfinished call; returns the counts and RSS figures."""
    sys.path.insert(0, str(HERE.parent))
    from kioskauth_testing import as_user, raw_call

    description = raw_call(daemon.socket, "org.varlink.service.GetInterfaceDescription",
                           {"interface": "io.kioskauth"})["parameters"]["description"]
    # Beside the daemon's directories (readable by the unprivileged worker).
    interface = Path(daemon.root) / "fuzz-io.kioskauth.varlink"
    interface.write_text(description)
    interface.chmod(0o644)
    pid = daemon.proc.pid
    result = {"frames": 0, "crashes": 0, "hangs": 0, "probes": 0, "slowest_probe_s": 0.0, "replies": {}}

    def phase(count: int, phase_seed: int) -> int:
        roles = ["root"] * workers_root + ["user"] * workers_user
        procs = []
        for i, role in enumerate(roles):
            cmd = [sys.executable, str(HERE), "worker", daemon.socket, str(interface), str(phase_seed * 100 + i),
                   str(count // len(roles)), role]
            procs.append(subprocess.Popen(as_user(cmd, None if role == "root" else user), stdout=subprocess.PIPE,
                                          text=True))
        done = threading.Event()

        def prober():
            while not done.wait(0.5):
                if daemon.proc.poll() is not None:
                    return
                took = probe(daemon.socket)
                result["probes"] += 1
                if took is None:
                    result["hangs"] += 1
                    log(f"hang: GetStatus did not answer within 2 s")
                else:
                    result["slowest_probe_s"] = max(result["slowest_probe_s"], took)

        thread = threading.Thread(target=prober, daemon=True)
        thread.start()
        sent = 0
        for p in procs:
            out, _ = p.communicate()
            for line in out.splitlines():
                report = json.loads(line)
                sent += report["sent"]
                for name, n in report["replies"].items():
                    result["replies"][name] = result["replies"].get(name, 0) + n
        done.set()
        thread.join()
        if daemon.proc.poll() is not None:
            result["crashes"] += 1
        return sent

    start = time.monotonic()
    result["frames"] += phase(warmup, seed)
    # Quiet for a moment first: the daemon returns freed memory half a second after connections
    # close (once it has processed the closes: seconds on a loaded machine with a debug build).
    time.sleep(3.0)
    result["rss_warm_kib"] = rss_kib(pid) if daemon.proc.poll() is None else 0
    result["anon_warm_kib"] = rss_kib(pid, "RssAnon") if daemon.proc.poll() is None else 0
    log(f"warm-up: {result['frames']} frames, RSS {result['rss_warm_kib']} KiB, anonymous {result['anon_warm_kib']} KiB")
    if not result["crashes"]:
        result["frames"] += phase(frames, seed + 1)
    if not result["crashes"] and large_connections:
        result["large_frames"] = large_frames(daemon.socket, large_connections, large_size)
        if daemon.proc.poll() is not None:
            result["crashes"] += 1
    result["seconds"] = round(time.monotonic() - start, 1)
    time.sleep(3.0)
    result["rss_end_kib"] = rss_kib(pid) if daemon.proc.poll() is None else 0
    result["anon_end_kib"] = rss_kib(pid, "RssAnon") if daemon.proc.poll() is None else 0
    if daemon.proc.poll() is not None and not result["crashes"]:
        result["crashes"] = 1
    result["exit_status"] = daemon.proc.poll()
    return result


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
