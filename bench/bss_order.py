#!/usr/bin/python3
"""Writes the .bss part of debian/kioskauthd.text-order: the input sections of kioskauthd's .bss
that a start touches, between the two markers `kioskauth_hot_bss_start` and
`kioskauth_hot_bss_end` (CKioskAuthSystem), so that lld links them first in .bss and next to one
another, and the daemon makes that part resident in one call at the top of `main`
(`kioskauth_populate_hot_bss`; docs/footprint.md, "The part of .bss a start touches").

Why: a start touched 136 of the 285 pages of .bss, spread over all of it, and read 118 of them
before writing them: two page faults each (the zero page, then a copy), each a TLB shootdown on
the other processor once a second thread runs.

How: links kioskauthd as bench/compare (and the package) does, with lld's map (which changes
nothing in the output); starts a copy of it without its debug information on libfprint's virtual
reader under valgrind's lackey, which reports every load and store; at READY=1 reads where the
program was loaded; and lists, in the order a start first touched them, the .bss input sections
of the map that hold an address it touched, each by a symbol defined in it and nowhere else.
The rest of the file (the functions, bench/text_order.py) is kept.

Rerun it when much has changed in what a start runs, after bench/text_order.py (which keeps this
part). Needs valgrind (`apt-get install valgrind`) and what bench/compare needs:

    /usr/bin/python3 bench/bss_order.py            # rewrites the .bss part of the order file
    /usr/bin/python3 bench/bss_order.py --check    # prints the figures, writes nothing
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIRST, LAST = "kioskauth_hot_bss_start", "kioskauth_hot_bss_end"
# Symbols the linker defines itself: lld ignores them in an ordering file.
LINKER_DEFINED = {"__bss_start", "_edata", "edata", "_end", "end", FIRST, LAST}
sys.path.insert(0, str(REPO / "bench" / "pam"))
from pam_part import load_compare  # noqa: E402  (bench/compare's functions, as a module)

import linkmap  # noqa: E402  (bench/linkmap.py)
from text_order import BSS_MARKER, ORDER_FILE  # noqa: E402  (the file, and where its .bss part begins)


def bss_sections(map_path: Path) -> list[tuple[int, int, str]]:
    """(start, end, input section) of every input section lld's map places in .bss, by address."""
    return [(start, end, name) for start, end, name, output in linkmap.input_sections(map_path) if output == ".bss"]


def symbols(binary: Path, low: int, high: int) -> tuple[list[tuple[int, str]], collections.Counter]:
    """The data symbols of `binary` in [low, high), by address, and how often each name occurs."""
    listing = subprocess.run(["nm", "-n", "--defined-only", str(binary)], capture_output=True, text=True,
                             check=True).stdout
    found = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in "bBdDvV" and low <= int(fields[0], 16) < high:
            found.append((int(fields[0], 16), fields[2]))
    return found, collections.Counter(name for _, name in found)


def own_symbol(named: list[tuple[int, str]], occurrences: collections.Counter, start: int, end: int) -> str | None:
    """A symbol defined in [start, end) and nowhere else (so that it names that input section),
    not one the linker defines; None when there is none."""
    first = bisect.bisect_left(named, (start, ""))
    for address, name in named[first:]:
        if address >= end:
            return None
        if occurrences[name] == 1 and name not in LINKER_DEFINED:
            return name
    return None


def touched_addresses(log: Path, low: int, high: int) -> list[int]:
    """The addresses in [low, high) lackey's log shows loaded, stored or modified, first touch
    first."""
    seen: dict[int, None] = {}
    with open(log, errors="replace") as lines:
        for line in lines:
            if len(line) < 4 or line[0] != " " or line[1] not in "LSM":
                continue
            address = int(line[3:].split(",", 1)[0], 16)
            if low <= address < high:
                seen.setdefault(address, None)
    return list(seen)


def run_under_lackey(compare, binary: Path, log: Path) -> int:
    """Starts `binary` on the virtual reader under lackey until READY=1; its load address."""
    sys.path.insert(0, str(REPO / "tests"))
    import kioskauth_testing

    kioskauth_testing.KIOSKAUTHD = str(binary)
    daemon = compare.kioskauth_daemon(fast_hash=True, reader=True)
    try:
        daemon.start(timeout=120)  # creates the store: what follows is a start, not a first start
        daemon.stop()
        daemon.prefix = ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}"]
        daemon.start(timeout=600)
        for line in Path(f"/proc/{daemon.proc.pid}/maps").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(binary) and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
        sys.exit(f"{binary} is not mapped in the daemon under lackey")
    finally:
        if daemon.proc and daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait()
        compare.discard(daemon)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="print the figures, write nothing")
    parser.add_argument("--output", type=Path, default=ORDER_FILE)
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("bench/bss_order.py needs valgrind: apt-get install valgrind")
    compare = load_compare()
    scratch = Path(tempfile.mkdtemp(prefix="kioskauth-bss-order-"))
    os.environ["KIOSKAUTH_BIN_DIR"] = str(scratch)  # bench/compare then does not build by itself
    try:
        map_path = scratch / "kioskauthd.map"
        print("building kioskauthd as bench/compare builds it, with lld's -Map", flush=True)
        compare.build_release(("-Xlinker", f"-Map={map_path}", "--product", "kioskauthd"))
        binary = scratch / "kioskauthd"
        # valgrind cannot read the toolchain's DWARF; the layout is the same without it.
        subprocess.run(["objcopy", "--strip-debug", str(compare.SCRATCH / "release" / "kioskauthd"), str(binary)],
                       check=True)
        sections = bss_sections(map_path)
        if not sections:
            sys.exit(f"no .bss input section in {map_path}")
        low, high = sections[0][0], sections[-1][1]
        named, occurrences = symbols(binary, low, high)
        if FIRST not in occurrences or LAST not in occurrences:
            sys.exit(f"{binary} lacks {FIRST} or {LAST}")
        print("one start under valgrind's lackey (a minute or two)", flush=True)
        log = scratch / "lackey.log"
        base = run_under_lackey(compare, binary, log)
        touched = touched_addresses(log, base + low, base + high)
        starts = [start for start, _, _ in sections]
        order, listed, pages, unnamed = [], set(), set(), 0
        for address in touched:
            link = address - base
            pages.add(link // 4096)
            index = bisect.bisect_right(starts, link) - 1
            if index < 0 or index in listed or not sections[index][0] <= link < sections[index][1]:
                continue
            listed.add(index)
            name = own_symbol(named, occurrences, sections[index][0], sections[index][1])
            if name:
                order.append(name)
            else:
                unnamed += 1
        hot_bytes = sum(sections[index][1] - sections[index][0] for index in listed)
        print(f".bss: {len(sections)} input sections, {(high - low) / 1024:.0f} KiB; a start touched "
              f"{len(touched)} addresses on {len(pages)} pages, in {len(listed)} input sections of "
              f"{hot_bytes / 1024:.0f} KiB ({unnamed} without a symbol of their own, left where they are)")
        if not order:
            sys.exit("no .bss input section to list: nothing written")
        if not args.check:
            current = args.output.read_text().splitlines() if args.output.exists() else []
            kept = current[:current.index(BSS_MARKER)] if BSS_MARKER in current else current
            args.output.write_text("\n".join(kept + [BSS_MARKER, FIRST, *order, LAST]) + "\n")
            print(f"wrote the .bss part of {args.output}: {len(order)} sections between {FIRST} and {LAST}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
