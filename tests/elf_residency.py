"""Which pages of a running program's own ELF sections are resident, from /proc/PID/pagemap
(root only), and which files it maps: used by tests/test_footprint.py, bench/rss_breakdown.py and
bench/idle_release.py."""

from __future__ import annotations

import bisect
import re
import subprocess
from collections import Counter
from pathlib import Path


def mapped(pid: int) -> set[str]:
    """The files mapped into process `pid` (from /proc/PID/maps)."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            names.add(fields[5])
    return names


def elf_sections(binary: str) -> list[tuple[int, int, str]]:
    """The binary's allocated sections: (address, size, name), by address."""
    listing = subprocess.run(["readelf", "-S", "-W", binary], capture_output=True, text=True).stdout
    sections = []
    for match in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]{16})\s+[0-9a-f]+\s+([0-9a-f]+)", listing, re.M):
        name, address, size = match.group(1), int(match.group(2), 16), int(match.group(3), 16)
        if address and size:
            sections.append((address, size, name))
    return sorted(sections)


def binary_sections(pid: int, binary: str) -> dict[str, tuple[int, int]] | None:
    """KiB of the binary resident by ELF section, (all, of which private copies): which pages of
    its mappings are present, from /proc/PID/pagemap (None when it cannot be read). A page is
    counted under the section at its start; private copies are pages written since mapping
    (relocated data, .data). Text pages are resident because they ran or because the kernel
    mapped them around a page fault that did (fault-around, 64 KiB)."""
    mappings = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]).name == Path(binary).name:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            mappings.append((low, high, int(fields[2], 16)))
    if not mappings:
        return None
    base = min(low - offset for low, _, offset in mappings)
    sections = elf_sections(binary)
    starts = [address for address, _, _ in sections]
    counts: Counter[str] = Counter()
    private: Counter[str] = Counter()
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for low, high, _ in mappings:
                pagemap.seek(low // 4096 * 8)
                entries = pagemap.read((high - low) // 4096 * 8)
                for index in range(len(entries) // 8):
                    entry = int.from_bytes(entries[index * 8:index * 8 + 8], "little")
                    if not entry >> 63 & 1:
                        continue
                    address = low + index * 4096 - base
                    position = bisect.bisect_right(starts, address) - 1
                    inside = position >= 0 and address < sections[position][0] + sections[position][1]
                    name = sections[position][2] if inside else "(between sections)"
                    counts[name] += 4
                    if not entry >> 61 & 1:  # not file-backed: a private copy
                        private[name] += 4
    except OSError:
        return None
    return {name: (size, private[name]) for name, size in counts.most_common()}
