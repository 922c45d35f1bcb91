"""NVML worker CPU time per poll vs a bare pynvml loop making the same calls, against the same stand-in state.

    python bench/poll.py [--quick]

Both run as child processes with the stand-in on LD_LIBRARY_PATH. CPU time per poll is the difference in child
CPU time (user + system, from wait4 rusage) between a run of K1 polls and a run of K2 polls, divided by K2 - K1,
so interpreter start-up and init cancel out. Each size is measured REPEATS times; the median is reported.
Target (issue 3, item 11): poll_ratio <= 1.3. The last line holds the figures as name=value pairs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.state import make_state, write_state  # noqa: E402

SIZES = [(8, 32, 400), (16, 256, 100)]  # GPUs, processes per GPU, polls measured (K2 - K1)
REPEATS = 3
TOP_N = 10  # the daemon's default processes.top_n

# The bare loop: exactly the pynvml calls the worker makes per poll (static facts once, at start), no bookkeeping.
BARE = r'''
import json, sys
import pynvml as N
opts = json.loads(sys.argv[1])
N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
N.nvmlSystemGetDriverVersion(); N.nvmlSystemGetNVMLVersion(); N.nvmlSystemGetCudaDriverVersion()
hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
for h in hs:
    N.nvmlDeviceGetUUID(h); N.nvmlDeviceGetName(h); N.nvmlDeviceGetPciInfo(h); N.nvmlDeviceGetSerial(h)
es = N.nvmlEventSetCreate()
for h in hs:
    N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError & N.nvmlDeviceGetSupportedEventTypes(h), es)
E = N.NVMLError
def call(fn, *a):
    try:
        return fn(*a)
    except E:
        return None
CLK = (N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_SM, N.NVML_CLOCK_MEM, N.NVML_CLOCK_VIDEO)
POL = (0, 1, 2, 3, 4, 5, 10, 11)
for _ in range(opts["max_polls"]):
    for h in hs:
        call(N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
        call(N.nvmlDeviceGetUtilizationRates, h)
        call(N.nvmlDeviceGetPerformanceState, h)
        call(N.nvmlDeviceGetTemperatureV, h, 0)
        for t in (1, 0, 3, 2):
            call(N.nvmlDeviceGetTemperatureThreshold, h, t)
        n = call(N.nvmlDeviceGetNumFans, h) or 0
        for i in range(n):
            call(N.nvmlDeviceGetFanSpeed_v2, h, i)
        call(N.nvmlDeviceGetPowerUsage, h)
        call(N.nvmlDeviceGetEnforcedPowerLimit, h)
        call(N.nvmlDeviceGetPowerManagementLimitConstraints, h)
        call(N.nvmlDeviceGetTotalEnergyConsumption, h)
        for c in CLK:
            call(N.nvmlDeviceGetClockInfo, h, c)
            call(N.nvmlDeviceGetMaxClockInfo, h, c)
        call(N.nvmlDeviceGetCurrentClocksEventReasons, h)
        call(N.nvmlDeviceGetSupportedClocksEventReasons, h)
        for p in POL:
            call(N.nvmlDeviceGetViolationStatus, h, p)
        call(N.nvmlDeviceGetEccMode, h)
        for t in (0, 1):
            for c in (0, 1):
                call(N.nvmlDeviceGetTotalEccErrors, h, t, c)
        call(N.nvmlDeviceGetRetiredPages, h, 0)
        call(N.nvmlDeviceGetRetiredPages, h, 1)
        call(N.nvmlDeviceGetRetiredPagesPendingStatus, h)
        call(N.nvmlDeviceGetRemappedRows, h)
        call(N.nvmlDeviceGetCurrPcieLinkGeneration, h)
        call(N.nvmlDeviceGetMaxPcieLinkGeneration, h)
        call(N.nvmlDeviceGetCurrPcieLinkWidth, h)
        call(N.nvmlDeviceGetMaxPcieLinkWidth, h)
        call(N.nvmlDeviceGetPcieThroughput, h, 0)
        call(N.nvmlDeviceGetPcieThroughput, h, 1)
        call(N.nvmlDeviceGetPcieReplayCounter, h)
        call(N.nvmlDeviceGetComputeRunningProcesses_v3, h)
        call(N.nvmlDeviceGetGraphicsRunningProcesses_v3, h)
    call(N.nvmlEventSetWait_v2, es, 0)
    N.nvmlDeviceGetCount()
'''


def bench_state(gpus: int, procs: int) -> dict[str, Any]:
    state = make_state(gpus)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {
            "compute": [{"pid": 10_000 + g * 1000 + i, "used_memory": (i + 1) << 20, "name": f"train{i}",
                         "user": "alice", "host_rss": 1 << 30} for i in range(procs)],
            "graphics": [],
        }
    return state


def child_cpu(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one child run to completion."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr else ""
    if p.stderr:
        p.stderr.close()
    if p.returncode != 0:
        raise SystemExit(f"{argv[1:3]} failed ({p.returncode}): {err[-2000:]}")
    return ru.ru_utime + ru.ru_stime


def per_poll(argv_for: Any, env: dict[str, str], k1: int, k2: int) -> float:
    samples = []
    for _ in range(REPEATS):
        a = child_cpu(argv_for(k1), env)
        b = child_cpu(argv_for(k2), env)
        samples.append((b - a) / (k2 - k1))
    return statistics.median(samples)


def main() -> None:
    quick = "--quick" in sys.argv
    libdir = build_standin()
    figures: dict[str, float] = {}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpus, procs, polls in SIZES:
            state_path = Path(tmp) / f"state-{gpus}x{procs}"
            write_state(state_path, bench_state(gpus, procs))
            env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), GPUWATCHD_SIM_STATE=str(state_path),
                       PYTHONPATH=str(ROOT))
            k1 = 3
            k2 = k1 + (polls // 10 if quick else polls)

            def worker_argv(k: int) -> list[str]:
                opts = {"interval": 0.0, "top_n": TOP_N, "max_polls": k}
                return [sys.executable, "-m", "gpuwatchd.sources.nvml_worker", json.dumps(opts)]

            def bare_argv(k: int) -> list[str]:
                return [sys.executable, "-c", BARE, json.dumps({"max_polls": k})]

            worker = per_poll(worker_argv, env, k1, k2)
            bare = per_poll(bare_argv, env, k1, k2)
            ratio = worker / bare
            ratios.append(ratio)
            tag = f"{gpus}x{procs}"
            figures[f"poll_ratio_{tag}"] = ratio
            figures[f"worker_ms_{tag}"] = worker * 1000
            figures[f"bare_ms_{tag}"] = bare * 1000
            print(f"{tag}: worker {worker * 1000:.2f} ms/poll, bare pynvml {bare * 1000:.2f} ms/poll, "
                  f"ratio {ratio:.3f} (polls {k2 - k1}, median of {REPEATS})", flush=True)
    head = {"poll_ratio": max(ratios)}
    print(" ".join(f"{k}={v:.3f}" for k, v in {**head, **figures}.items()))


if __name__ == "__main__":
    main()
