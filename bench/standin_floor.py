"""Cost of one call into the stand-in NVML driver: the floor the daemon's polling cost is compared against.

Calls nvmlDeviceGetPowerUsage through ctypes in a tight loop, next to a libc call through ctypes (the FFI cost
alone), and through the pynvml wrapper (what the worker pays). Last line: name=value pairs, nanoseconds per call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatchd.sim.build import SONAME, build_standin
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state, write_state

CALLS = 100_000
ROUNDS = 5


def per_call_ns(fn: Callable[[], object]) -> float:
    """Median over ROUNDS of the mean ns per call in a loop of CALLS."""
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter_ns() - t0) / CALLS)
    return statistics.median(samples)


def main() -> None:
    libdir = build_standin()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        write_state(state, make_state(8))
        os.environ[STATE_ENV] = str(state)
        import pynvml

        lib = ctypes.CDLL(str(libdir / SONAME))
        pynvml.nvmlLib = lib
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        out = ctypes.c_uint()
        ref = ctypes.byref(out)
        power = lib.nvmlDeviceGetPowerUsage
        mem = pynvml.c_nvmlMemory_v2_t()
        mem.version = pynvml.nvmlMemory_v2
        mem_ref = ctypes.byref(mem)
        mem_v2 = lib.nvmlDeviceGetMemoryInfo_v2
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        labs = libc.labs

        assert power(handle, ref) == 0 and out.value == 25000
        assert mem_v2(handle, mem_ref) == 0
        baseline = per_call_ns(lambda: labs(-5))
        standin = per_call_ns(lambda: power(handle, ref))
        standin_mem = per_call_ns(lambda: mem_v2(handle, mem_ref))
        wrapped = per_call_ns(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        pynvml.nvmlShutdown()
    print(f"calls per round: {CALLS}, rounds: {ROUNDS}, GPUs in state: 8")
    print(
        f"ctypes_baseline_ns={baseline:.0f} standin_power_ns={standin:.0f} standin_memory_v2_ns={standin_mem:.0f} "
        f"standin_own_ns={max(standin - baseline, 0):.0f} pynvml_power_ns={wrapped:.0f}"
    )


if __name__ == "__main__":
    main()
