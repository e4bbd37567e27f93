"""The overnight cut-off is a local time in the daemon's time zone (TZ, else /etc/localtime), DST
nights included, although the daemon runs on FoundationEssentials alone (whose TimeZone knows
only GMT): a daemon in Europe/Berlin ends sessions at 04:00 Berlin time, a cut-off skipped by the
spring-forward night falls at the end of the gap, and one that the autumn night repeats falls on
its first occurrence.

The daemon's wall clock is moved to chosen instants with KIOSKAUTH_TEST_CLOCK_FILE.

Run: python3 -m pytest tests/test_session_time_zone.py
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from idp_testing import Connection, TestClock, set_passcode
from kioskauth_testing import FAST_HASH_CONFIG
from test_sessions import PASSCODE, authenticated_session


def start(make_daemon, cutoff: str, opened_at: str, zone: str = "Europe/Berlin"):
    """A daemon in `zone` with the cut-off at `cutoff`, its wall clock at `opened_at` (UTC)."""
    d = make_daemon(config=FAST_HASH_CONFIG + "\n[Fingerprint]\nEnabled=no\n"
                    + f"\n[Session]\nIdleTimeoutSec=86400\nMaxAgeSec=0\nOvernightCutoff={cutoff}\n")
    clock = TestClock(d.root / "clock.json")
    target = datetime.fromisoformat(opened_at).replace(tzinfo=timezone.utc).timestamp()
    clock.set(target - time.time(), 0)
    d.extra_env.update({"KIOSKAUTH_TEST_CLOCK_FILE": str(clock.path), "TZ": zone})
    d.start()
    assert d.ctl("user", "add", "sarah", "--uid", "4242").returncode == 0
    set_passcode(d, "sarah", PASSCODE)
    return d


@pytest.mark.parametrize("cutoff, opened_at, expected", [
    # Summer (CEST, UTC+2): 04:00 in Berlin is 02:00 UTC, the same night.
    ("04:00", "2026-06-01T20:00:00", "2026-06-02T02:00:00Z"),
    # Winter (CET, UTC+1): 03:00 UTC.
    ("04:00", "2026-01-15T20:00:00", "2026-01-16T03:00:00Z"),
    # Opened after 04:00 Berlin but before 04:00 UTC: the next night, not an hour later.
    ("04:00", "2026-06-01T03:00:00", "2026-06-02T02:00:00Z"),
    # 29 March 2026: the clock jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist, so the
    # cut-off is the end of the gap, 03:00 CEST.
    ("02:30", "2026-03-28T20:00:00", "2026-03-29T01:00:00Z"),
    # 25 October 2026: 02:30 occurs twice (CEST, then CET); the first counts.
    ("02:30", "2026-10-24T20:00:00", "2026-10-25T00:30:00Z"),
])
def test_the_overnight_cutoff_is_local_time_in_the_daemons_zone(make_daemon, cutoff, opened_at, expected):
    d = start(make_daemon, cutoff, opened_at)
    conn = Connection(d.socket)
    session = authenticated_session(d, conn)
    conn.close()
    assert session["overnightCutoff"] == expected, session
