"""What the binaries cost to load (issue #15's footprint): the admin CLI runs on
FoundationEssentials, so neither the full Foundation nor ICU (~30 MB of data and code) is mapped
into it. `bench/rss_breakdown.py` measures the daemon's mappings and threads."""

import re
import subprocess

from kioskauth_testing import KIOSKAUTHCTL

# Foundation proper, its internationalisation layer and ICU; FoundationEssentials is fine.
HEAVY = re.compile(r"libFoundation\.so|libFoundationInternationalization|_FoundationICU|libicu|libFoundationNetworking")


def needed(binary) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_kioskauthctl_maps_neither_foundation_nor_icu():
    heavy = [lib for lib in needed(KIOSKAUTHCTL) if HEAVY.search(lib)]
    assert heavy == [], heavy


def test_kioskauthctl_still_starts_and_formats_without_them(daemon):
    version = subprocess.run([str(KIOSKAUTHCTL), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()
    # The widest display name has characters outside the BMP: columns are padded by characters
    # (NSString's padding counted UTF-16 units and cut the last emoji off).
    wide = "Sarah Quinn-Ashworth \U0001F642\U0001F642"
    added = daemon.ctl("user", "add", "sarah", "--display-name", wide)
    assert added.returncode == 0, added.stderr
    assert daemon.ctl("user", "add", "omar").returncode == 0
    listing = daemon.ctl("user", "list")
    assert listing.returncode == 0, listing.stderr
    assert wide in listing.stdout, listing.stdout
    rows = [line for line in listing.stdout.splitlines() if line.strip()]
    # Every row's third column (ROLES) starts at the same character.
    starts = {len(re.match(r"\S+\s+.*?\s{2,}", row).group(0)) for row in rows}
    assert len(starts) == 1, listing.stdout
