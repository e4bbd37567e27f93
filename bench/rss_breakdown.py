#!/usr/bin/env python3
"""Where kioskauthd's resident memory goes, by mapping, and its threads (issue #15's footprint).

Starts the daemon (release build: .build/release, or $KIOSKAUTH_BIN_DIR) with an empty store,
and prints from /proc/PID/smaps the resident size of each group of mappings — the binary, the
Swift runtime, Foundation (and FoundationEssentials, ICU, FoundationNetworking), the HTTP stack
FoundationNetworking brings (curl, gnutls, krb5, LDAP, ...), libfprint and GLib, SQLite, libc, the
heap and malloc arenas, thread stacks — and the threads by name, three times: idle after start,
under GetStatus load (--connections clients for --seconds), and idle again after the load; and,
idle, the binary's own resident pages by ELF section (from /proc/PID/pagemap). Then
the wall time from exec to exit of `kioskauthd --version` (median of --runs) and the libraries
the binary needs (ldd); the same two for kioskauthctl.

    python3 bench/rss_breakdown.py [--connections 8] [--seconds 5] [--runs 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("KIOSKAUTH_BIN_DIR", str(ROOT / ".build" / "release"))
sys.path.insert(0, str(ROOT / "tests"))
from elf_residency import binary_sections  # noqa: E402
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHCTL, KIOSKAUTHD, Daemon  # noqa: E402

# (group, pattern on the mapping's file name); the first match wins.
GROUPS = [
    ("ICU", r"libicu|_FoundationICU"),
    ("FoundationNetworking", r"libFoundationNetworking"),
    ("FoundationEssentials", r"libFoundationEssentials"),
    ("Foundation", r"libFoundation\.so|libFoundationXML"),
    ("curl/TLS/krb5/LDAP (HTTP)",
     r"libcurl|libgnutls|libnettle|libhogweed|libgmp|libtasn1|libp11|libkrb5|libk5crypto|libgssapi|libkeyutils|"
     r"libcom_err|libldap|liblber|libsasl|libssh|libnghttp|librtmp|libpsl|libidn|libunistring|libbrotli|"
     r"libssl|libcrypto"),
    ("libswiftCore", r"libswiftCore"),
    ("other Swift runtime", r"libswift|libdispatch|libBlocksRuntime|lib_Testing"),
    ("libfprint/GLib/gusb", r"libfprint|libglib|libgobject|libgio|libgmodule|libgusb|libusb|libgudev|libudev|"
     r"libpixman|libcairo|libnss|libnspr|libpcre|libffi|libmount|libblkid|libselinux"),
    ("SQLite/Argon2", r"libsqlite|libargon2"),
    ("libc/libstdc++/ld", r"libc\.so|libm\.so|ld-linux|libstdc\+\+|libgcc_s|libpthread|libdl|librt"),
]


def group_of(name: str, binary: str) -> str:
    if name == binary or name.endswith("/kioskauthd"):
        return "binary (kioskauthd)"
    if name == "[heap]":
        return "heap (brk)"
    if name.startswith("[stack"):
        return "main stack"
    if name in ("[vdso]", "[vvar]", "[vsyscall]"):
        return "kernel (vdso)"
    for group, pattern in GROUPS:
        if re.search(pattern, name):
            return group
    return "other files" if name.startswith("/") else "other"


def breakdown(pid: int, binary: str) -> dict[str, int]:
    """KiB resident by group. Anonymous mappings of 8 MiB (+ guard) are thread stacks, the other
    anonymous ones malloc arenas and runtime allocations."""
    sizes: Counter[str] = Counter()
    current = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+$", fields[0]):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if not name:
                name = "thread stacks" if high - low in (8 << 20, (8 << 20) + 4096) else "anonymous (arenas, runtime)"
                current = name
            else:
                current = group_of(name, binary)
        elif fields[0] == "Rss:" and current:
            sizes[current] += int(fields[1])
    return dict(sizes)


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0])
    return out


def threads(pid: int) -> dict[str, int]:
    names: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[(task / "comm").read_text().strip()] += 1
        except OSError:
            pass
    return dict(names)


def sample(pid: int, binary: str) -> dict:
    return {"status": status(pid), "groups": breakdown(pid, binary), "threads": threads(pid)}


def load(socket_path: str, connections: int, seconds: float) -> int:
    """GetStatus as fast as `connections` clients can, each on one connection; returns calls."""
    counts = [0] * connections
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(socket_path)
        buf = b""
        while time.monotonic() < stop:
            s.sendall(b'{"method":"io.kioskauth.GetStatus"}\0')
            while b"\0" not in buf:
                buf += s.recv(65536)
            buf = buf.split(b"\0", 1)[1]
            counts[i] += 1
        s.close()

    workers = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts)


def exec_to_exit(runs: int, binary=KIOSKAUTHD) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([str(binary), "--version"], stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def libraries(binary=KIOSKAUTHD) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in out.splitlines() if "=>" in line or line.strip().startswith("/"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = str(Path(KIOSKAUTHD).resolve())
    d = Daemon(config=FAST_HASH_CONFIG + "\n[Socket]\nRequestsPerSecondPerUID=100000\n").start()
    try:
        time.sleep(2)
        idle = sample(d.proc.pid, binary)
        sections = binary_sections(d.proc.pid, binary)
        loaded: dict = {}

        def sample_midway() -> None:
            time.sleep(args.seconds * 0.8)
            loaded.update(sample(d.proc.pid, binary))

        sampler = threading.Thread(target=sample_midway)
        sampler.start()
        calls = load(d.socket, args.connections, args.seconds)
        sampler.join()
        time.sleep(3)
        after = sample(d.proc.pid, binary)
    finally:
        d.close()
    result = {"binary": binary, "idle": idle, "binary_sections_idle": sections, "loaded": loaded, "after_load": after,
              "load_calls_per_s": round(calls / args.seconds), "exec_to_exit_ms": round(exec_to_exit(args.runs), 2),
              "libraries": libraries(), "ctl_exec_to_exit_ms": round(exec_to_exit(args.runs, KIOSKAUTHCTL), 2),
              "ctl_libraries": libraries(KIOSKAUTHCTL)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    phases = [("idle", idle), (f"loaded ({args.connections} conn.)", loaded), ("idle after", after)]
    groups = sorted({g for _, s in phases for g in s["groups"]}, key=lambda g: -idle["groups"].get(g, 0))
    print(f"{'KiB resident':34}" + "".join(f"{name:>22}" for name, _ in phases))
    for g in groups:
        print(f"{g:34}" + "".join(f"{s['groups'].get(g, 0):>22}" for _, s in phases))
    for key in ("VmRSS", "RssAnon", "RssFile"):
        print(f"{key:34}" + "".join(f"{s['status'].get(key, 0):>22}" for _, s in phases))
    print(f"{'threads':34}" + "".join(f"{sum(s['threads'].values()):>22}" for _, s in phases))
    for _, s in phases[:1]:
        print("threads idle: " + ", ".join(f"{n}×{c}" if c > 1 else n for n, c in sorted(s["threads"].items())))
    if sections is None:
        print("the binary by section: /proc/PID/pagemap cannot be read")
    else:
        print("the binary idle, KiB resident by ELF section (of which private copies):")
        for name, (size, copied) in sections.items():
            if size >= 64:
                print(f"  {name:32}{size:>10}" + (f"  ({copied})" if copied else ""))
    print(f"GetStatus under load: {result['load_calls_per_s']} calls/s")
    print(f"exec-to-exit of kioskauthd --version: {result['exec_to_exit_ms']} ms (median of {args.runs})")
    print("libraries: " + " ".join(Path(lib).name for lib in result["libraries"]))
    print(f"exec-to-exit of kioskauthctl --version: {result['ctl_exec_to_exit_ms']} ms (median of {args.runs})")
    print("kioskauthctl libraries: " + " ".join(Path(lib).name for lib in result["ctl_libraries"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
