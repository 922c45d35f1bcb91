"""What every probe gets from the worker: the torch module, the device, and a synchronising timer.

The probe modules never import torch (only ``worker.py`` may); they receive it here, so the very same code runs
on ``cuda`` (a real GPU) and on ``cpu`` (tests, ``gpuwatchd sim``), only at other sizes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from gpuwatchd.probes.faults import ProbeFaults


@dataclass(frozen=True, slots=True)
class Sizes:
    """Work sizes of one run (the worker scales them to the device and the config's bounds)."""

    gemm_n: int  # square GEMM dimension (the inner dimension the tolerance grows with)
    memory_bytes: int  # bytes the memory pattern test writes and reads back
    transfer_bytes: int  # bytes per host<->device copy
    launches: int = 200


@dataclass(frozen=True, slots=True)
class ProbeContext:
    torch: Any
    device: str  # "cuda" or "cpu"
    faults: ProbeFaults

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def timed(self, fn: Any, repeat: int) -> float:
        """Best wall time of ``repeat`` synchronised calls (the best is the least disturbed by other work)."""
        best = float("inf")
        for _ in range(max(1, repeat)):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t0)
        return max(best, 1e-9)


def finite(x: float) -> float | None:
    """JSON has no NaN/Inf: a non-finite measure is reported as missing."""
    return x if math.isfinite(x) else None
