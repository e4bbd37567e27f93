#!/usr/bin/python3
"""Which library inside the static kioskauthd its idle resident pages belong to.

kioskauthd links the Swift runtime, Foundation, NIO, BoringSSL, postgres-nio and the rest
statically, so /proc/PID/smaps (bench/rss_breakdown.py) sees one "binary" line. This splits it:
it links the binary as the package links it (bench/compare's build, with lld's -Map added, which
changes nothing in the output), starts a fresh copy of it on an empty store with libfprint's
virtual reader, and after --seconds reads which of its pages are resident (/proc/PID/pagemap).
Each resident page is shared out among the input sections the link map places on it, by bytes,
and the input sections are grouped by the archive or module they came from.

The last line adds up what only postgres-nio (the fleet's directory client) brings into the
daemon: Foundation, CoreFoundation, FoundationInternationalization and ICU, and postgres-nio
itself with its connection pool. That is what moving the directory client into a process of its
own would take off a terminal (docs/footprint.md).

The copy is fresh for every run on purpose: how the page cache holds the file (the size of its
folios) moves the resident figure by megabytes (docs/footprint.md), and a fresh copy is one
state every run can reproduce.

    /usr/bin/python3 bench/rss_by_library.py [--runs 3] [--seconds 2] [--top 25]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = Path(tempfile.mkdtemp(prefix="kioskauth-rss-by-library-"))
# The daemon runs from the fresh copies in WORK; bench/compare then does not build by itself.
os.environ["KIOSKAUTH_BIN_DIR"] = str(WORK)
sys.path.insert(0, str(REPO / "bench" / "pam"))
sys.path.insert(0, str(REPO / "tests"))
from pam_part import load_compare  # noqa: E402  (bench/compare's functions, as a module)

import linkmap  # noqa: E402  (bench/linkmap.py)

# Output sections that are not loaded.
UNLOADED = (".debug", ".comment", ".symtab", ".strtab", ".shstrtab", ".swift_modhash", ".gnu_debug")
# Groups that only postgres-nio brings into the daemon (its modules import Foundation proper).
FLEET_ONLY = ("Foundation", "CoreFoundation", "FoundationInternationalization", "ICU", "PostgresNIO",
              "_ConnectionPoolModule")


def group_of(input_section: str) -> str:
    """The library an input section of the link map came from."""
    origin = input_section.split(":(")[0]
    archive = re.match(r".*/([^/()]+)\.a\(", origin)
    if archive:
        name = archive.group(1).removeprefix("lib")
        if name == "_FoundationICU":
            return "ICU"
        if name.startswith("swift") or name in ("dispatch", "BlocksRuntime"):
            return "Swift runtime"
        return name
    module = re.search(r"/([^/]+)\.build/", origin)
    if module:
        name = module.group(1)
        return "BoringSSL" if "BoringSSL" in name else name
    return "linker-made (PLT, relocations, …)" if origin.startswith("<internal>") else Path(origin).name


def link_with_map(compare, map_path: Path) -> Path:
    """Links kioskauthd as bench/compare (and the package) does, writing lld's map; the binary."""
    print("building kioskauthd as bench/compare builds it, with lld's -Map", flush=True)
    compare.build_release(("-Xlinker", f"-Map={map_path}", "--product", "kioskauthd"))
    return compare.SCRATCH / "release" / "kioskauthd"


def input_sections(map_path: Path) -> list[tuple[int, int, str, str]]:
    """(start, end, input section, output section) of every loaded input section, by address."""
    return [section for section in linkmap.input_sections(map_path) if not section[3].startswith(UNLOADED)]


def loads(binary: Path) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, file size) of every LOAD segment."""
    headers = subprocess.run(["readelf", "-lW", str(binary)], capture_output=True, text=True, check=True).stdout
    pattern = r"LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x([0-9a-f]+)"
    return [tuple(int(value, 16) for value in match.groups()) for match in re.finditer(pattern, headers)]


def resident_addresses(pid: int, binary: Path, segments) -> list[int]:
    """Link-time addresses of `binary`'s pages that `pid` has resident."""
    addresses = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[5] != str(binary):
            continue
        low, high = (int(value, 16) for value in fields[0].split("-"))
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            pagemap.seek(low // 4096 * 8)
            entries = pagemap.read((high - low) // 4096 * 8)
        for index in range(len(entries) // 8):
            if not int.from_bytes(entries[index * 8:index * 8 + 8], "little") >> 63:  # not present
                continue
            offset = int(fields[2], 16) + index * 4096
            for file_offset, address, size in segments:
                if file_offset <= offset < file_offset + size:
                    addresses.append(offset - file_offset + address)
                    break
    return addresses


def attribute(pages: list[int], sections) -> tuple[Counter, Counter]:
    """Bytes of the resident pages by library and by output section."""
    starts = [section[0] for section in sections]
    reach = []  # the furthest end of any section up to each index
    for _, end, _, _ in sections:
        reach.append(max(end, reach[-1] if reach else 0))
    by_group, by_output = Counter(), Counter()
    for page in pages:
        index = bisect.bisect_left(starts, page + 4096) - 1
        while index >= 0 and reach[index] > page:
            start, end, name, output = sections[index]
            overlap = min(end, page + 4096) - max(start, page)
            if overlap > 0:
                by_group[group_of(name)] += overlap
                by_output[output] += overlap
            index -= 1
    return by_group, by_output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="idle time after READY=1")
    parser.add_argument("--top", type=int, default=25, help="libraries to list")
    args = parser.parse_args()
    compare = load_compare()
    try:
        map_path = WORK / "kioskauthd.map"
        built = link_with_map(compare, map_path)
        sections = input_sections(map_path)
        groups: dict[str, list[int]] = {}
        outputs: dict[str, list[int]] = {}
        totals = []
        for run in range(args.runs):
            # A fresh copy each run: one page-cache state every run can reproduce.
            for name in ("kioskauthd", "kioskauthctl"):
                (WORK / name).unlink(missing_ok=True)
            shutil.copy2(built, WORK / "kioskauthd")
            shutil.copy2(built.with_name("kioskauthctl"), WORK / "kioskauthctl")
            binary = WORK / "kioskauthd"
            daemon = compare.kioskauth_daemon(fast_hash=True)
            try:
                compare.timed_start(daemon)
                time.sleep(args.seconds)
                pages = resident_addresses(daemon.proc.pid, binary, loads(binary))
            finally:
                compare.discard(daemon)
            by_group, by_output = attribute(pages, sections)
            totals.append(len(pages) * 4)
            for name in set(groups) | set(by_group):
                groups.setdefault(name, [0] * run).append(by_group.get(name, 0) // 1024)
            for name in set(outputs) | set(by_output):
                outputs.setdefault(name, [0] * run).append(by_output.get(name, 0) // 1024)
        median = {name: statistics.median(values) for name, values in groups.items()}
        print(f"kioskauthd's resident pages, {args.seconds:g} s after READY=1 with a reader, median of "
              f"{args.runs}: {statistics.median(totals):,.0f} KiB")
        print("by output section (KiB):")
        for name, values in sorted(outputs.items(), key=lambda item: -statistics.median(item[1]))[:10]:
            print(f"  {name:32} {statistics.median(values):8,.0f}")
        print("by library (KiB):")
        for name, value in sorted(median.items(), key=lambda item: -item[1])[:args.top]:
            print(f"  {name:32} {value:8,.0f}{'  (only through postgres-nio)' if name in FLEET_ONLY else ''}")
        fleet_only = sum(value for name, value in median.items() if name in FLEET_ONLY)
        print(f"only through postgres-nio (the fleet's directory client): {fleet_only:,.0f} KiB")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
