#!/usr/bin/env python3
"""PAM round trip through pam_kioskauth.so against its floor.

Measures, on libfprint's virtual_device reader:

  fingerprint  pamtester -> pam_kioskauth.so (mode=verify) -> kioskauthd -> libfprint verify ->
               success, one finger enrolled;
  floor        the same pamtester/pam_wrapper run with pam_permit.so as the only auth module;

and prints the medians and their difference. Both are whole `timeout pamtester ...` runs, spawn
to exit, alternated so that both see the same machine. The touch is queued on the virtual reader
before each fingerprint run (the driver takes it as soon as the scan starts), so the driver's
reaction time is not measured. A second pair measures pam_start_confdir + pam_authenticate +
pam_end inside one process (ctypes), which leaves process start-up out.

Run from the repository root after `swift build` and `make -C pam`:

    python3 bench/pam/bench_pam.py [--iterations 200]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from fprint_virtual import environment, scan  # noqa: E402
from kioskauth_testing import FAST_HASH_CONFIG, Daemon  # noqa: E402
from pam_support import MODULE, PamConfig, VarlinkConnection, enroll, module_build, security_dir  # noqa: E402


def call(d: Daemon, method: str, parameters: dict) -> dict:
    connection = VarlinkConnection(d.socket)
    connection.send({"method": f"io.kioskauth.{method}", "parameters": parameters})
    reply = connection.receive()
    connection.close()
    assert "error" not in reply, reply
    return reply


def pamtester_run(config: PamConfig, service: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "PAM_WRAPPER"))}
    cmd = ["timeout", "10", "env", "LD_PRELOAD=libpam_wrapper.so", "PAM_WRAPPER=1",
           f"PAM_WRAPPER_SERVICE_DIR={config.dir}", "pamtester", service, "sarah", "authenticate"]
    started = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if result.returncode != 0 or b"successfully authenticated" not in result.stdout:
        raise RuntimeError(f"{service}: {result.stdout!r} {result.stderr!r}")
    return elapsed


class InProcess:
    """pam_start_confdir + pam_authenticate + pam_end through ctypes, in this process."""

    class Conv(ctypes.Structure):
        CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        _fields_ = [("conv", CALLBACK), ("appdata_ptr", ctypes.c_void_p)]

    def __init__(self, config: PamConfig):
        self.pam = ctypes.CDLL("libpam.so.0")
        self.confdir = str(config.dir).encode()
        # Info messages only ("Touch the fingerprint reader"): nothing to answer.
        self.callback = self.Conv.CALLBACK(lambda count, messages, responses, data: 0)
        self.conv = self.Conv(self.callback, None)
        self.pam.pam_start_confdir.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(self.Conv),
                                               ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.pam.pam_authenticate.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.pam.pam_end.argtypes = [ctypes.c_void_p, ctypes.c_int]

    def run(self, service: str) -> float:
        handle = ctypes.c_void_p()
        started = time.perf_counter()
        rc = self.pam.pam_start_confdir(service.encode(), b"sarah", ctypes.byref(self.conv), self.confdir,
                                        ctypes.byref(handle))
        if rc == 0:
            rc = self.pam.pam_authenticate(handle, 0)
        self.pam.pam_end(handle, rc)
        elapsed = time.perf_counter() - started
        if rc != 0:
            raise RuntimeError(f"{service}: PAM code {rc}")
        return elapsed


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered) * 1000, "p10_ms": ordered[len(ordered) // 10] * 1000,
            "p90_ms": ordered[len(ordered) * 9 // 10] * 1000, "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200, help="timed runs of each kind (default 200)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    module_build()
    d = Daemon(config=FAST_HASH_CONFIG)
    sensor = d.root / "sensor.sock"
    d.extra_env.update(environment("virtual_device", sensor, base={}))
    d.start()
    try:
        call(d, "AddPerson", {"name": "sarah"})
        enroll(d, sensor, "sarah", "sarah-finger")
        config = PamConfig(Path(tempfile.mkdtemp(prefix="kioskauth-bench-")))
        config.add("fingerprint", f"auth required {MODULE} socket={d.socket} mode=verify\n")
        config.add("floor", f"auth required {security_dir() / 'pam_permit.so'}\n")
        in_process = InProcess(config)

        def fingerprint(runner):
            scan(sensor, "sarah-finger")  # queued until the scan starts
            return runner("fingerprint")

        results = {}
        for label, runner in (("pamtester", lambda s: pamtester_run(config, s)), ("in-process", in_process.run)):
            for _ in range(args.warmup):
                fingerprint(runner)
                runner("floor")
            samples = {"fingerprint": [], "floor": []}
            for _ in range(args.iterations):
                samples["fingerprint"].append(fingerprint(runner))
                samples["floor"].append(runner("floor"))
            results[label] = {kind: summary(values) for kind, values in samples.items()}
            results[label]["difference_ms"] = (results[label]["fingerprint"]["median_ms"]
                                               - results[label]["floor"]["median_ms"])
    finally:
        d.close()

    print(f"PAM round trip on virtual_device, {args.iterations} runs each (medians; p10-p90):")
    for label, figures in results.items():
        fp, floor = figures["fingerprint"], figures["floor"]
        print(f"  {label:10}  fingerprint {fp['median_ms']:7.2f} ms ({fp['p10_ms']:.2f}-{fp['p90_ms']:.2f})"
              f"   floor (pam_permit) {floor['median_ms']:7.2f} ms ({floor['p10_ms']:.2f}-{floor['p90_ms']:.2f})"
              f"   difference {figures['difference_ms']:+.2f} ms")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
