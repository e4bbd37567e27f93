"""While a passcode is hashed, the event loop's thread steps back ([Store] PasscodeHashYield,
default 10 nice steps) and returns to the daemon's own nice value before the reply is written,
so that a flood of socket calls on a small machine does not slow a passcode unlock down; only
when the daemon can set it back (CAP_SYS_NICE, or RLIMIT_NICE as the unit's LimitNICE=+0 gives),
and never otherwise (docs/design.md, "Argon2id pool")."""

from __future__ import annotations

import os
import threading
import time

from kioskauth_testing import connect, read_message, send_message



def hash_config(store: str = "") -> str:
    """Real Argon2id costs (about 0.1 s a hash here), long enough to watch the event loop's nice
    value while one runs, `store` lines more in [Store]; no reader."""
    return f"[Store]\nPasscodeHashMemoryKiB=65536\nPasscodeHashIterations=3\n{store}[Fingerprint]\nEnabled=no\n"


NAME, PASSCODE = "ada", "482913"
NOBODY = 65534


def event_loop_thread(pid: int) -> int:
    """The id of kioskauthd's event loop thread (NIO names it NIO-ELT-…)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as comm:
            if comm.read().startswith("NIO-ELT-"):
                return int(task)
    raise AssertionError(f"kioskauthd {pid} has no event loop thread")


def thread_nice(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])  # field 19, nice


def add_people(d, count: int = 1) -> None:
    """People NAME0, NAME1, … with PASSCODE."""
    s = connect(d.socket, timeout=30)
    try:
        for index in range(count):
            name = f"{NAME}{index}"
            for method, parameters in (("AddPerson", {"name": name}),
                                       ("SetPasscode", {"name": name, "passcode": PASSCODE, "confirmation": PASSCODE})):
                send_message(s, {"method": f"io.kioskauth.{method}", "parameters": parameters})
                reply = read_message(s)
                assert reply is not None and "error" not in reply, reply
    finally:
        s.close()


def nice_while_verifying(d, callers: int = 1, rounds: int = 2) -> tuple[list[int], list[int]]:
    """`callers` connections each verify a passcode of their own (`add_people(d, callers)`)
    `rounds` times, concurrently, while the
    event loop's nice value is sampled every half millisecond. Returns the values seen while
    any call was out, and the value read by each caller right after each of its replies."""
    pid = d.proc.pid
    tid = event_loop_thread(pid)
    after: list[int] = []
    failures: list[object] = []
    lock = threading.Lock()

    def caller(name: str) -> None:
        s = connect(d.socket, timeout=30)
        try:
            for _ in range(rounds):
                send_message(s, {"method": "io.kioskauth.VerifyPasscode",
                                 "parameters": {"name": name, "passcode": PASSCODE}})
                reply = read_message(s)
                nice = thread_nice(pid, tid)
                with lock:
                    if reply is None or "error" in reply:
                        failures.append(reply)
                    after.append(nice)
        finally:
            s.close()

    threads = [threading.Thread(target=caller, args=(f"{NAME}{i}",)) for i in range(callers)]
    for thread in threads:
        thread.start()
    seen = []
    while any(thread.is_alive() for thread in threads):
        seen.append(thread_nice(pid, tid))
        time.sleep(0.0005)
    for thread in threads:
        thread.join()
    assert not failures, failures
    return seen, after


def test_the_event_loop_steps_back_while_a_passcode_is_hashed_and_is_back_before_the_reply(make_daemon):
    d = make_daemon(config=hash_config()).start()
    add_people(d)
    tid = event_loop_thread(d.proc.pid)
    assert thread_nice(d.proc.pid, tid) == 0
    seen, after = nice_while_verifying(d)
    assert 10 in seen, seen
    assert set(seen) <= {0, 10}, seen
    # Set back by the time each reply arrives.
    assert after == [0, 0], after
    assert "steps back" not in d.log_text(), d.log_text()


def test_concurrent_hashes_keep_the_event_loop_back_until_the_last_one_ends(make_daemon):
    """Two workers, four callers with two passcodes each: the transitions are counted, so the
    event loop is at 10 while any hash runs and at 0 once all have ended."""
    d = make_daemon(config=hash_config("PasscodeHashWorkers=2\n")).start()
    add_people(d, 4)
    seen, after = nice_while_verifying(d, callers=4, rounds=2)
    assert len(after) == 8
    assert seen.count(10) > seen.count(0), seen  # mostly stepped back while calls were out
    assert set(seen) <= {0, 10}, seen
    assert thread_nice(d.proc.pid, event_loop_thread(d.proc.pid)) == 0
    # Another hash later still steps it back: nothing was left disabled.
    seen, after = nice_while_verifying(d)
    assert 10 in seen and after[-1] == 0, (seen, after)


def test_yield_zero_leaves_the_event_loop_alone(make_daemon):
    d = make_daemon(config=hash_config("PasscodeHashYield=0\n")).start()
    add_people(d)
    seen, after = nice_while_verifying(d)
    assert set(seen) == {0} and after == [0, 0], (seen, after)


def test_a_yield_beyond_nineteen_is_a_named_configuration_error(make_daemon):
    d = make_daemon(config=hash_config("PasscodeHashYield=20\n"))
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "PasscodeHashYield=20: expected a whole number in 0...19" in d.log_text(), d.log_text()


def unprivileged(d, *, nice_capability: bool, wrapper: tuple[str, ...] = ()) -> None:
    """Runs `d` as nobody with no capabilities but, if `nice_capability`, CAP_SYS_NICE (ambient),
    inside `wrapper` (a seccomp harness, say)."""
    os.chown(d.root, NOBODY, NOBODY)
    caps = ["--inh-caps=+sys_nice", "--ambient-caps=+sys_nice"] if nice_capability else ["--inh-caps=-all"]
    d.prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *caps, "--", *wrapper]


def test_without_a_way_back_nothing_is_stepped_back_and_the_start_says_so(make_daemon):
    """As nobody with the default RLIMIT_NICE of 0 and no CAP_SYS_NICE, raising the nice value
    would be for good: the daemon leaves it alone, says why at start, and passcodes verify."""
    d = make_daemon(config=hash_config())
    unprivileged(d, nice_capability=False)
    d.start()
    add_people(d)
    seen, after = nice_while_verifying(d)
    assert set(seen) == {0} and after == [0, 0], (seen, after)
    assert "the event loop does not step back while passcodes are hashed" in d.log_text(), d.log_text()
    assert "LimitNICE=+0" in d.log_text()


def test_an_unprivileged_daemon_that_may_set_it_back_steps_back_and_returns(make_daemon):
    """Nobody with CAP_SYS_NICE. (The unit's way, RLIMIT_NICE from LimitNICE=+0, cannot be set up
    here: raising a hard resource limit needs CAP_SYS_RESOURCE, which these machines' root lacks.)"""
    d = make_daemon(config=hash_config())
    unprivileged(d, nice_capability=True)
    d.start()
    add_people(d)
    seen, after = nice_while_verifying(d)
    assert 10 in seen and after == [0, 0], (seen, after)
    assert "steps back" not in d.log_text(), d.log_text()
