"""``launch``: kernel launch + synchronize latency (a driver or GSP that starts to stall shows here first).

The median of many one-element kernels each followed by a synchronize; on ``cpu`` the same loop measures the
dispatcher's overhead. It cannot see a stall that comes and goes between runs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpuwatchd.probes.context import ProbeContext, Sizes, finite


def run(ctx: ProbeContext, sizes: Sizes) -> dict[str, Any]:
    x = ctx.torch.zeros(1, device=ctx.device)
    ctx.sync()
    samples = []
    for _ in range(max(10, sizes.launches)):
        t0 = time.perf_counter()
        x.add_(1)
        ctx.sync()
        samples.append(time.perf_counter() - t0)
    return {"launches": len(samples), "latency_seconds": finite(statistics.median(samples))}
