"""``pcie``: pinned host-to-device and device-to-host copy bandwidth.

The verdict compares it with what the link should carry (``gpuwatchd.gpu.pcie_bandwidth``) and with the GPU's
own baseline. It proves the transfers run at that speed now; it cannot tell a bad riser from a dock sharing its
tunnel with displays, only that the bytes arrive slower than the link allows.
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.probes.context import ProbeContext, Sizes, finite

REPEAT = 5


def run(ctx: ProbeContext, sizes: Sizes) -> dict[str, Any]:
    torch = ctx.torch
    n = max(1 << 16, sizes.transfer_bytes)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=ctx.on_gpu)  # pinned needs CUDA; on cpu, plain memory
    host.fill_(0x5A)
    dev = torch.empty(n, dtype=torch.uint8, device=ctx.device)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=ctx.on_gpu)
    h2d_s = ctx.timed(lambda: dev.copy_(host, non_blocking=True), REPEAT)
    d2h_s = ctx.timed(lambda: back.copy_(dev, non_blocking=True), REPEAT)
    factor = ctx.faults.bandwidth_factor
    return {
        "bytes": n,
        "pinned": ctx.on_gpu,
        "h2d_bytes_per_second": finite(n / h2d_s * factor),
        "d2h_bytes_per_second": finite(n / d2h_s * factor),
        "roundtrip_ok": bool(torch.equal(back, host)),
    }
