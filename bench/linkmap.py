"""lld's link map (`-Xlinker -Map=PATH`): where each input section of a program was placed.
Shared by bench/rss_by_library.py and bench/bss_order.py."""

from __future__ import annotations

import re
from pathlib import Path

# A line of the map: address, load address, size, alignment, then the name indented by depth
# (an output section, one of its input sections, or a symbol in one).
_ROW = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+( +)(.*)$")


def input_sections(map_path: Path) -> list[tuple[int, int, str, str]]:
    """(start, end, input section, output section) of every input section with a size, by
    address."""
    found = []
    output = None
    with open(map_path) as lines:
        next(lines)  # the header
        for line in lines:
            match = _ROW.match(line)
            if not match:
                continue
            text = match.group(4)
            if len(match.group(3)) < 3 and " " not in text:
                output = text
            elif ":(" in text and output:
                start, size = int(match.group(1), 16), int(match.group(2), 16)
                if size:
                    found.append((start, start + size, text, output))
    found.sort()
    return found
