#!/usr/bin/env python3
"""Time from exec to READY=1 against the number of audit events in the store.

For each size (default 0, 1000 and 10000 events) a debug kioskauthd (.build/debug, or
$KIOSKAUTH_BIN_DIR) gets a fresh store, the events are appended through the real API (ResetLockout
on one person, over one socket connection), the daemon is stopped cleanly and then started
--runs times, timing each start from exec to READY=1 on its NOTIFY_SOCKET. Prints the median and
the fastest start per size. Start-up should be flat in the number of events: the check before
serving verifies the audit chain only from the anchored head on.

    python3 bench/ready_time.py [--sizes 0,1000,10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kioskauth_testing import Daemon, connect, read_message, send_message  # noqa: E402


def fill(daemon: Daemon, events: int) -> None:
    assert daemon.ctl("user", "add", "sarah", "--display-name", "Sarah").returncode == 0
    s = connect(daemon.socket)
    try:
        for _ in range(events):
            send_message(s, {"method": "io.kioskauth.ResetLockout", "parameters": {"name": "sarah"}})
            reply = read_message(s)
            assert reply is not None and "error" not in reply, reply
    finally:
        s.close()


def time_to_ready(daemon: Daemon) -> float:
    started = time.monotonic()
    daemon.start(timeout=120)
    elapsed = time.monotonic() - started
    daemon.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0,1000,10000")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'events':>8} {'median ms':>10} {'min ms':>8}")
    for size in (int(x) for x in args.sizes.split(",")):
        daemon = Daemon().start()
        try:
            fill(daemon, size)
            daemon.stop()
            times = [time_to_ready(daemon) * 1000 for _ in range(args.runs)]
        finally:
            daemon.close()
        print(f"{size:>8} {statistics.median(times):>10.1f} {min(times):>8.1f}", flush=True)


if __name__ == "__main__":
    main()
