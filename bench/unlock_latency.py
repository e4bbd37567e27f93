#!/usr/bin/env python3
"""Passcode unlock latency with the identity provider up, down (killed) and hanging (SIGSTOP).

Starts the real django-oauth-toolkit server (tests/idp/server.py, loopback only, exits by itself)
and a debug kioskauthd (.build/debug, or $KIOSKAUTH_BIN_DIR) configured for it, signs an IdP
person in online, sets their passcode, then times VerifyPasscode over one socket connection, N
runs per condition. Access tokens live a few seconds, so background refreshes keep hitting the
provider while the unlocks are timed: a down provider refuses them, a stopped one leaves them
hanging until the request timeout. The daemon's default Argon2id parameters are used unless
--fast-hash is given (the hash dominates the number; the point is that it does not change).

    python3 bench/unlock_latency.py [--runs 40] [--fast-hash]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from idp_testing import (  # noqa: E402
    SARAH, Connection, IdentityServer, login, make_identity_daemon, ok, set_passcode,
)
from kioskauth_testing import FAST_HASH_CONFIG, KIOSKAUTHD, Daemon  # noqa: E402

PASSCODE = "482913"
ACCESS_SECONDS = 3


def measure(conn: Connection, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        ok(conn.call("VerifyPasscode", {"name": SARAH[0], "passcode": PASSCODE}))
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="unlocks timed per condition")
    parser.add_argument("--fast-hash", action="store_true", help="cheap Argon2id (1 MiB, 1 pass) as in the tests")
    args = parser.parse_args()
    if not KIOSKAUTHD.exists():
        print(f"{KIOSKAUTHD} is not built (swift build)", file=sys.stderr)
        return 2

    made: list[Daemon] = []

    def make_daemon(**kwargs):
        if not args.fast_hash:
            kwargs["config"] = kwargs["config"].replace(FAST_HASH_CONFIG, "")
        daemon = Daemon(**kwargs)
        made.append(daemon)
        return daemon

    idp = IdentityServer(access_seconds=ACCESS_SECONDS, refresh_seconds=3600, lifetime=900)
    results: dict[str, tuple[float, float]] = {}
    try:
        daemon, _ = make_identity_daemon(make_daemon, idp)
        daemon.start()
        name = ok(login(daemon))["person"]["name"]
        set_passcode(daemon, name, PASSCODE)
        conn = Connection(daemon.socket, timeout=60)
        measure(conn, 3)  # warm up

        results["up"] = summary(measure(conn, args.runs))

        idp.kill()
        time.sleep(ACCESS_SECONDS)  # refreshes now fail: connection refused
        results["down (killed)"] = summary(measure(conn, args.runs))

        idp.start()
        time.sleep(ACCESS_SECONDS)
        idp.stop()
        time.sleep(ACCESS_SECONDS)  # a refresh is now stuck until the 2 s request timeout
        try:
            results["hanging (SIGSTOP)"] = summary(measure(conn, args.runs))
        finally:
            idp.cont()
        conn.close()
    finally:
        for daemon in made:
            daemon.close()
        idp.close()

    hashing = "fast test Argon2id (1 MiB, 1 pass)" if args.fast_hash else "default Argon2id (64 MiB, 3 passes)"
    print(f"passcode unlock latency, {args.runs} runs per condition, {hashing}:")
    for condition, (median, p90) in results.items():
        print(f"  IdP {condition:<18} median {median:7.1f} ms   p90 {p90:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
