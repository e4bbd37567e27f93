#!/usr/bin/python3
"""Writes debian/kioskauthd.text-order: the functions a kiosk's kioskauthd runs, and then those
its fleet helper kioskauth-fleet runs, for lld's --symbol-ordering-file, so that the package
links each program's running functions next to one another at the start of its .text
(docs/footprint.md, "Linking: lld, packed relocations, hot text first"). Both programs are
linked with the one file; a name a program lacks is ignored.

Why: the kernel maps a binary's pages around each page fault (fault-around, 64 KiB) and reads
far ahead of it (read_ahead_kb: 8 MiB on this machine's disk), so a daemon whose few thousand
running functions are spread over 28 MB of text keeps most of that text resident. Packed
together, they are a few MB.

How: builds what bench/compare builds (the release build as debian/rules builds it, with the
current order file), copies kioskauthd without its debug information (valgrind cannot read
the toolchain's DWARF), and runs a kiosk's day in short with every daemon under valgrind's
callgrind: cold starts with and without a reader, status calls, a person added, a passcode set
and verified, a finger enrolled on libfprint's virtual reader and PAM unlocks through
pamtester. Every function of the binary that callgrind saw run is written, in the order
callgrind first reports them; and before them all, those an idle daemon runs once it has handed
its code back (docs/footprint.md, "Idle release"): the release itself, the task that waits for
the next call, and the timers of an idle daemon; then those PAM fingerprint unlocks run. After
a release only those are mapped again, 64 KiB around each, so packed together they are a few
windows instead of dozens, and an unlock after a release maps in little more. Then a fleet member's start, creation of a fleet, a person
pushed and syncs, against a PostgreSQL it starts, with the helper under callgrind (a script
named kioskauth-fleet beside the copied daemon runs it so); the helper's functions that ran and
are not listed yet follow the daemon's. Names are mangled: lld matches them to the binary's symbols and
ignores those it does not find, so a stale file costs only memory.

Needs valgrind (`apt-get install valgrind`) and what bench/compare needs (it installs that).
Rerun it when code that runs at start or on every unlock changed much:

    /usr/bin/python3 bench/text_order.py            # writes debian/kioskauthd.text-order
    /usr/bin/python3 bench/text_order.py --check    # prints the figures, writes nothing
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ORDER_FILE = REPO / "debian" / "kioskauthd.text-order"
# The line after kioskauthd's functions, before the helper's (tests/test_deb.py reads it).
HELPER_MARKER = "# kioskauth-fleet: the functions of the fleet helper that ran, not listed above"
# Where the .bss part begins (bench/bss_order.py writes it; this script keeps it).
BSS_MARKER = "# .bss: the input sections a start of kioskauthd touches, in the order it first touches them"
sys.path.insert(0, str(REPO / "bench" / "pam"))
from pam_part import load_compare  # noqa: E402  (bench/compare's functions, as a module)


# The binary --------------------------------------------------------------------------------------


def functions(binary: Path) -> dict[str, int]:
    """Size of every function symbol of the binary, by name."""
    listing = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True, text=True,
                             check=True).stdout
    found = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "tTwW":
            found[fields[3]] = int(fields[1], 16)
    return found


def text_size(binary: Path) -> int:
    listing = subprocess.run(["readelf", "-S", "-W", str(binary)], capture_output=True, text=True, check=True).stdout
    match = re.search(r"\]\s+\.text\s+PROGBITS\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", listing)
    return int(match.group(1), 16) if match else 0


def functions_run(profiles: list[Path]) -> list[str]:
    """Every function callgrind reports as run (fn=) or called (cfn=), first report first."""
    seen: dict[str, None] = {}
    pattern = re.compile(r"^c?fn=\(\d+\) (.+)$")
    for profile in profiles:
        for line in profile.read_text(errors="replace").splitlines():
            match = pattern.match(line)
            if match:
                seen.setdefault(match.group(1), None)
    return list(seen)


# A kiosk's day, in short -------------------------------------------------------------------------


def workload(compare, new_daemon, discard, starts: int, unlocks: int, status_calls: int, dump) -> Path | None:
    """What a kiosk's daemon does most, through the real socket, reader and PAM stack; daemons
    come from `new_daemon(reader=)` and go through `discard`. `dump(daemon)` has callgrind write
    what the daemon ran since the last dump (and start counting again) and returns that profile:
    called before and after the unlocks, and the second is returned (what unlocks run)."""
    from pam_support import MODULE, PamConfig

    for index in range(starts):
        daemon = new_daemon(reader=index % 2 == 0)
        try:
            daemon.start(timeout=300)
            compare.varlink_calls(daemon.socket, [("GetStatus", {})] * 20 + [
                ("AddPerson", {"name": "p1"}),
                ("SetPasscode", {"name": "p1", "passcode": compare.PASSCODE, "confirmation": compare.PASSCODE}),
                ("VerifyPasscode", {"name": "p1", "passcode": compare.PASSCODE}),
                ("ListPeople", {}), ("GetPerson", {"name": "p1"})])
        finally:
            discard(daemon)
    work = Path(tempfile.mkdtemp(prefix="kioskauth-text-order-"))
    work.chmod(0o755)
    world = compare.FprintdWorld(work)
    daemon = new_daemon(reader=True)
    try:
        compare.start_enrolled(daemon, timeout=300)
        config = PamConfig(Path(tempfile.mkdtemp(prefix="pam-", dir=world.root)))
        config.add("finger", f"auth required {MODULE} socket={daemon.socket} mode=verify\n")
        dump(daemon)
        for _ in range(unlocks):
            compare.touch(daemon.sensor, compare.FINGER_ID)
            compare.pamtester(config.dir, "finger", compare.PERSON, world.env)
        unlocking = dump(daemon)
        compare.varlink_calls(daemon.socket, [("GetStatus", {})] * status_calls)
    finally:
        discard(daemon)
        world.close()
        shutil.rmtree(work, ignore_errors=True)
    return unlocking


def idle_workload(compare, daemon, discard, profiles: Path, quiet: float) -> Path | None:
    """What runs in an idle daemon after an idle release: `daemon` (under callgrind, its profiles
    in `profiles`, with `[Daemon] IdleReleaseSec=quiet`) answers a few calls; its profile is
    zeroed, and dumped once the release that follows and some idling have run. At the default
    log level: a debug line would add the logging of the release to what an idle daemon runs.
    Returns the dumped profile."""
    try:
        daemon.start(timeout=300)
        time.sleep(10)  # start-up's release (a second after the sweep, slower under valgrind)
        compare.varlink_calls(daemon.socket, [("GetStatus", {})] * 5)
        subprocess.run(["callgrind_control", "--zero", str(daemon.proc.pid)], capture_output=True, timeout=120)
        time.sleep(quiet + 10)  # the release, then idling
        return dump_profile(daemon, profiles)
    finally:
        discard(daemon)


def dump_profile(daemon, profiles: Path) -> Path | None:
    """Has callgrind write what `daemon` ran since its last dump (and count from zero again) into
    `profiles`; returns that profile."""
    before = set(profiles.iterdir())
    subprocess.run(["callgrind_control", "--dump", str(daemon.proc.pid)], capture_output=True, timeout=120)
    dumped = sorted(set(profiles.iterdir()) - before)
    return dumped[0] if dumped else None


def fleet_workload(scratch: Path, helper: Path, profiles: Path, syncs: int) -> None:
    """A fleet member's life in short, with the fleet helper under callgrind: the daemon (the
    copy in `scratch`, not profiled here) starts `scratch`/kioskauth-fleet, a script that runs
    `helper` under valgrind."""
    wrapper = scratch / "kioskauth-fleet"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec {shutil.which('valgrind')} --tool=callgrind --demangle=no -q "
        f"--callgrind-out-file={profiles}/helper.%p {helper} \"$@\"\n")
    wrapper.chmod(0o755)
    from fleet_support import Fleet, children, ok

    fleet = Fleet(["virtual_image"], fleet_config="PollIntervalSec=1\n")
    try:
        fleet.start()
        terminal = fleet[0]
        terminal.add_person("p1")
        terminal.set_passcode("p1", "482913")
        for _ in range(syncs):
            ok(terminal.sync())
        ok(terminal.rpc("FleetTerminals"))
        for pid in children(terminal.proc.pid, name=None):  # valgrind, under its own name
            subprocess.run(["callgrind_control", "--dump", str(pid)], capture_output=True, timeout=120)
    finally:
        fleet.close()
        # A confined helper under valgrind may outlive its daemon, spinning (and the daemon may
        # have started another): none is left behind.
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(helper).encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--unlocks", type=int, default=20)
    parser.add_argument("--status-calls", type=int, default=200)
    parser.add_argument("--syncs", type=int, default=20)
    parser.add_argument("--check", action="store_true", help="print the figures, write nothing")
    parser.add_argument("--output", type=Path, default=ORDER_FILE)
    args = parser.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        sys.exit("bench/text_order.py needs valgrind: apt-get install valgrind")
    compare = load_compare()
    compare.ensure_build()
    built = Path(os.environ["KIOSKAUTH_BIN_DIR"]) / "kioskauthd"
    scratch = Path(tempfile.mkdtemp(prefix="kioskauth-text-order-"))
    try:
        binary = scratch / "kioskauthd"
        subprocess.run(["objcopy", "--strip-debug", str(built), str(binary)], check=True)
        profiles = scratch / "profiles"
        profiles.mkdir()
        sys.path.insert(0, str(REPO / "tests"))
        import kioskauth_testing

        kioskauth_testing.KIOSKAUTHD = str(binary)
        def under_callgrind(reader: bool):
            daemon = compare.kioskauth_daemon(fast_hash=True, reader=reader)
            daemon.prefix = ["valgrind", "--tool=callgrind", "--demangle=no", "-q",
                             f"--callgrind-out-file={profiles}/callgrind.%p"]
            return daemon

        def dump_then_discard(daemon):
            # The profile is written at exit, which a stopping daemon under valgrind may not reach
            # before the harness kills it: dump it first.
            if daemon.proc and daemon.proc.poll() is None:
                subprocess.run(["callgrind_control", "--dump", str(daemon.proc.pid)], capture_output=True, timeout=120)
            compare.discard(daemon)

        unlock_profile = workload(compare, under_callgrind, dump_then_discard, args.starts, args.unlocks,
                                  args.status_calls, lambda daemon: dump_profile(daemon, profiles))
        if unlock_profile is None:
            sys.exit("callgrind dumped no profile of the unlocks: nothing written")
        idle_profiles = scratch / "idle-profiles"
        idle_profiles.mkdir()
        idle_daemon = compare.kioskauth_daemon(fast_hash=True, reader=True, idle_release="3")
        idle_daemon.prefix = ["valgrind", "--tool=callgrind", "--demangle=no", "-q",
                              f"--callgrind-out-file={idle_profiles}/callgrind.%p"]
        idle_profile = idle_workload(compare, idle_daemon, compare.discard, idle_profiles, 3)
        if idle_profile is None:
            sys.exit("callgrind dumped no profile of the idle daemon: nothing written")
        sizes = functions(binary)
        idle = [name for name in functions_run([idle_profile]) if name in sizes]
        unlocking = [name for name in functions_run([unlock_profile]) if name in sizes]
        ran = functions_run(sorted(profiles.iterdir()))
        chosen = list(dict.fromkeys(idle + unlocking + [name for name in ran if name in sizes]))
        print(f"functions an idle daemon ran after its release: {len(idle)}, "
              f"{sum(sizes[name] for name in idle) / 1024:.0f} KiB; unlocks ran {len(unlocking)}, "
              f"{sum(sizes[name] for name in unlocking) / 1024:.0f} KiB")
        print(f"functions that ran: {len(ran)}; of kioskauthd: {len(chosen)}, "
              f"{sum(sizes[name] for name in chosen) / 2**20:.2f} MiB of its {text_size(binary) / 2**20:.1f} MiB "
              "of text")
        if not chosen:
            sys.exit("callgrind reported no function of kioskauthd: nothing written")
        helper = scratch / "kioskauth-fleet.real"
        subprocess.run(["objcopy", "--strip-debug", str(built.parent / "kioskauth-fleet"), str(helper)], check=True)
        helper_profiles = scratch / "helper-profiles"
        helper_profiles.mkdir()
        listed = set(chosen)
        try:
            fleet_workload(scratch, helper, helper_profiles, args.syncs)
        except subprocess.TimeoutExpired:
            # callgrind_control reaches a process through valgrind's gdbserver, whose pipes in /tmp
            # the helper's Landlock domain may no longer open: no profile then.
            pass
        current = args.output.read_text().splitlines() if args.output.exists() else []  # the file as it is
        helper_sizes = functions(helper)
        helper_ran = [name for name in functions_run(sorted(helper_profiles.iterdir())) if name in helper_sizes]
        if helper_ran:
            added = [name for name in helper_ran if name not in listed]
            print(f"of kioskauth-fleet: {len(helper_ran)} ran, "
                  f"{sum(helper_sizes[name] for name in helper_ran) / 2**20:.2f} MiB of its "
                  f"{text_size(helper) / 2**20:.1f} MiB of text; {len(added)} not listed for kioskauthd")
        else:
            # Kept from the current file, so that the helper's functions stay packed.
            kept = current[current.index(HELPER_MARKER) + 1:] if HELPER_MARKER in current else []
            kept = kept[:kept.index(BSS_MARKER)] if BSS_MARKER in kept else kept  # not the .bss part
            added = [name for name in kept if name and name not in listed]
            print(f"callgrind could not profile kioskauth-fleet: its {len(added)} functions are kept from "
                  f"{args.output.name}")
            if not added:
                sys.exit("no function of kioskauth-fleet to list: nothing written")
        if not args.check:
            # The .bss part (bench/bss_order.py) is kept as it is.
            bss = current[current.index(BSS_MARKER):] if BSS_MARKER in current else []
            args.output.write_text(
                "# Written by bench/text_order.py: the functions of kioskauthd that ran in a kiosk's day in\n"
                "# short, then those of kioskauth-fleet in a fleet member's, for lld's\n"
                "# --symbol-ordering-file (debian/rules); then, from bench/bss_order.py, the .bss input\n"
                "# sections a start touches. Regenerate it; do not edit it.\n"
                + "\n".join(chosen) + "\n" + HELPER_MARKER + "\n" + "\n".join(added) + "\n"
                + "".join(line + "\n" for line in bss))
            print(f"wrote {args.output}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
