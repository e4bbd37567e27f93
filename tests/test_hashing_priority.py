"""A passcode hash runs above the rest of the daemon ([Store] PasscodeHashPriority, default 10
nice steps): the worker's thread is raised while it hashes and set back before the caller
resumes, so that a flood of socket calls on a small machine does not slow a passcode unlock
down, and nothing else the daemon runs is ever raised; only when the daemon may (CAP_SYS_NICE,
or RLIMIT_NICE as the unit's LimitNICE=-10 gives), and otherwise said once (docs/design.md,
"Argon2id pool")."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import threading
import time

from kioskauth_testing import as_user, connect, read_message, send_message

NAME, PASSCODE = "ada", "482913"
NOBODY = pwd.getpwnam("nobody").pw_uid


def hash_config(store: str = "") -> str:
    """Real Argon2id costs (about 0.1 s a hash here), long enough to watch the threads' nice
    values while one runs, `store` lines more in [Store]; no reader."""
    return f"[Store]\nPasscodeHashMemoryKiB=65536\nPasscodeHashIterations=3\n{store}[Fingerprint]\nEnabled=no\n"


def thread_nices(pid: int) -> dict[int, tuple[str, int]]:
    """Every thread of `pid`: its name and nice value (threads that exit meanwhile left out)."""
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm, open(f"/proc/{pid}/task/{task}/stat") as stat:
                found[int(task)] = (comm.read().strip(), int(stat.read().rsplit(")", 1)[1].split()[16]))  # field 19
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


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


def status_flood(d, stop: threading.Event) -> None:
    """GetStatus, pipelined on one connection, until `stop`: work that resumes continuations and
    may start threads of the cooperative pool while hashes run."""
    s = connect(d.socket, timeout=30)
    try:
        while not stop.is_set():
            for _ in range(16):
                send_message(s, {"method": "io.kioskauth.GetStatus"})
            for _ in range(16):
                assert "error" not in read_message(s)
    finally:
        s.close()


def nices_while_verifying(d, callers: int = 1, rounds: int = 2, flood: bool = False):
    """`callers` connections each verify a passcode of their own (`add_people(d, callers)`)
    `rounds` times, concurrently (with a GetStatus flood beside them if `flood`), while every
    thread's nice value is sampled. Returns the values seen on hashing threads (`argon2-N`), those
    seen on every other thread, and each hashing thread's value right after each reply."""
    pid = d.proc.pid
    hashing, others, after = [], [], []
    failures: list[object] = []
    lock = threading.Lock()

    def caller(name: str) -> None:
        s = connect(d.socket, timeout=30)
        try:
            for _ in range(rounds):
                send_message(s, {"method": "io.kioskauth.VerifyPasscode",
                                 "parameters": {"name": name, "passcode": PASSCODE}})
                reply = read_message(s)
                if callers == 1:  # with one caller no other hash can be running now
                    after.extend(nice for comm, nice in thread_nices(pid).values() if comm.startswith("argon2-"))
                with lock:
                    if reply is None or "error" in reply:
                        failures.append(reply)
        finally:
            s.close()

    stop = threading.Event()
    flooding = threading.Thread(target=status_flood, args=(d, stop)) if flood else None
    if flooding:
        flooding.start()
    threads = [threading.Thread(target=caller, args=(f"{NAME}{i}",)) for i in range(callers)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        for comm, nice in thread_nices(pid).values():
            (hashing if comm.startswith("argon2-") else others).append(nice)
        time.sleep(0.0005)
    for thread in threads:
        thread.join()
    stop.set()
    if flooding:
        flooding.join()
    assert not failures, failures
    return hashing, others, after


def test_a_hash_runs_raised_and_its_thread_is_set_back_before_the_reply(make_daemon):
    d = make_daemon(config=hash_config()).start()
    add_people(d)
    hashing, others, after = nices_while_verifying(d)
    assert -10 in hashing, hashing
    assert set(hashing) <= {0, -10}, hashing
    # Nothing but the hash is raised. (libdispatch sets its threads' values by their quality of
    # service: -4 for its manager thread at the lowest.)
    assert min(others) >= -4, others
    assert after == [0, 0], after
    assert "own priority" not in d.log_text(), d.log_text()


def test_nothing_but_hashes_is_ever_raised_under_concurrent_hashes_and_a_status_flood(make_daemon):
    """Four callers with three passcodes each (queued for the one worker), and a GetStatus flood:
    threads the daemon starts meanwhile (the cooperative pool's, as continuations resume) are
    never raised, and once the calls are answered no thread is."""
    d = make_daemon(config=hash_config()).start()
    add_people(d, 4)
    hashing, others, _ = nices_while_verifying(d, callers=4, rounds=3, flood=True)
    assert -10 in hashing, hashing
    assert min(others) >= -4, others
    assert min(nice for _, nice in thread_nices(d.proc.pid).values()) >= -4


def test_hashes_on_several_lanes_or_workers_for_every_processor_are_not_raised(make_daemon):
    """A hash on two lanes starts Argon2id threads that would inherit the value; as many workers
    as processors would leave none to the rest: neither is raised, and the second is said."""
    d = make_daemon(config=hash_config("PasscodeHashParallelism=2\n")).start()
    add_people(d)  # its verifier has two lanes
    hashing, others, after = nices_while_verifying(d)
    assert min(hashing + others) >= -4, (hashing, others)
    processors = len(os.sched_getaffinity(0))
    d = make_daemon(config=hash_config(f"PasscodeHashWorkers={processors}\n")).start()
    add_people(d)
    hashing, others, after = nices_while_verifying(d)
    assert min(hashing + others) >= -4, (hashing, others)
    assert f"{processors} hashing workers would leave no processor of {processors} to the rest" in d.log_text()


def test_priority_zero_leaves_hashes_at_the_daemons_own(make_daemon):
    d = make_daemon(config=hash_config("PasscodeHashPriority=0\n")).start()
    add_people(d)
    hashing, others, after = nices_while_verifying(d)
    assert set(hashing) == {0} and min(others) >= -4 and after == [0, 0], (hashing, after)


def test_a_priority_beyond_twenty_is_a_named_configuration_error(make_daemon):
    d = make_daemon(config=hash_config("PasscodeHashPriority=21\n"))
    d.start(expect_ready=False)
    assert d.wait_exit() == 78
    assert "PasscodeHashPriority=21: expected a whole number in 0...20" in d.log_text(), d.log_text()


def unprivileged(d, *, nice_capability: bool, wrapper: tuple[str, ...] = ()) -> None:
    """Runs `d` as nobody with no capabilities but, if `nice_capability`, CAP_SYS_NICE (ambient),
    with RLIMIT_NICE 0 (lowering a limit needs no privilege), inside `wrapper` (a seccomp
    harness, say)."""
    os.chown(d.root, NOBODY, NOBODY)
    caps = ["--inh-caps=+sys_nice", "--ambient-caps=+sys_nice"] if nice_capability else ["--inh-caps=-all"]
    d.prefix = ["prlimit", "--nice=0:0", "--", *as_user(list(wrapper), "nobody", options=caps)]


def test_a_daemon_that_may_not_raise_hashes_runs_them_at_its_own_priority_and_says_so(make_daemon):
    d = make_daemon(config=hash_config())
    unprivileged(d, nice_capability=False)
    d.start()
    add_people(d)
    hashing, others, after = nices_while_verifying(d)
    assert set(hashing) == {0} and min(others) >= -4 and after == [0, 0], (hashing, after)
    log = d.log_text()
    assert log.count("passcode hashes run at the daemon's own priority: a nice value of -10 needs CAP_SYS_NICE "
                     "or LimitNICE=-10") == 1, log  # once, for two hashes


def test_an_unprivileged_daemon_that_may_raise_hashes_does(make_daemon):
    """Nobody with CAP_SYS_NICE. (The unit's way, RLIMIT_NICE 30 from LimitNICE=-10, cannot be set
    up here: raising a hard resource limit needs CAP_SYS_RESOURCE, which these machines' root
    lacks.)"""
    d = make_daemon(config=hash_config())
    unprivileged(d, nice_capability=True)
    d.start()
    add_people(d)
    hashing, others, after = nices_while_verifying(d)
    assert -10 in hashing and min(others) >= -4 and after == [0, 0], (hashing, after)
    assert "own priority" not in d.log_text(), d.log_text()


def test_a_storm_from_the_kiosk_app_group_raises_only_the_worker_and_status_is_still_served(make_daemon):
    """The attack: a kiosk app (the authenticator group, an unprivileged uid) storms VerifyPasscode
    with right passcodes (no lockout stops it) over six connections at once. The one worker's
    thread is raised while it hashes, no other thread ever is, and root's status call is still
    answered while the storm runs."""
    from kioskauth_testing import ensure_group
    from test_concurrent_limits import STORM_CLIENT

    ensure_group("kioskauth")
    d = make_daemon(config=hash_config("PasscodeHashWorkers=1\n")).start()
    add_people(d, 6)
    seconds = 4
    storm = [subprocess.Popen(as_user([sys.executable, "-c", STORM_CLIENT, d.socket, f"{NAME}{i}", PASSCODE, str(seconds)],
                                      "nobody", ["kioskauth"]), stdout=subprocess.PIPE, text=True)
             for i in range(6)]
    raised_at_once, others = [], []
    try:
        deadline = time.monotonic() + seconds - 0.5
        while time.monotonic() < deadline:
            nices = thread_nices(d.proc.pid).values()
            raised_at_once.append(sum(1 for comm, nice in nices if comm.startswith("argon2-") and nice == -10))
            others += [nice for comm, nice in nices if not comm.startswith("argon2-")]
            time.sleep(0.001)
        status = d.call("io.kioskauth.GetStatus")
    finally:
        outputs = [p.communicate(timeout=seconds + 30)[0] for p in storm]
    assert "error" not in status, status
    answers = [line.split()[1] for out in outputs for line in out.splitlines() if line.strip()]
    assert answers and set(answers) == {"ok"}, answers[:5]
    assert max(raised_at_once) == 1, raised_at_once  # the one worker, raised while the storm hashed
    assert min(others) >= -4, others
