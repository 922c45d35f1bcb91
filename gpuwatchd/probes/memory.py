"""``memory``: pattern test over a bounded share of free device memory, and device-to-device copy bandwidth.

Walking ones and walking zeros (each of the 32 bits of every 32-bit word set alone, then cleared alone) catch
stuck and coupled data bits; a seeded random block catches address and pattern-sensitive faults the regular
patterns miss. Every write is read back by a comparison on the device; the count of mismatching words is the
result. It proves the tested bytes hold data now; it cannot reach memory the user's processes hold, and a
weak cell that needs heat or hours to fail may pass (that is what ECC counters and ``dcgmi diag -r 3`` are for).
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.probes.context import ProbeContext, Sizes, finite

SEED = 7411
STUCK_BIT = 1 << 3
WORD_BYTES = 4


def run(ctx: ProbeContext, sizes: Sizes) -> dict[str, Any]:
    torch = ctx.torch
    words = max(1024, sizes.memory_bytes // WORD_BYTES)
    buf = torch.empty(words, dtype=torch.int32, device=ctx.device)
    stuck = _stuck_words(ctx, words)
    mismatches = 0
    patterns = 0
    for bit in range(32):
        one = _as_int32(1 << bit)
        for value in (one, ~one):  # walking ones, walking zeros
            buf.fill_(value)
            _inject(buf, stuck)
            mismatches += int((buf != value).sum().item())
            patterns += 1
    gen = torch.Generator(device=ctx.device).manual_seed(SEED)
    src = torch.randint(-(2**31), 2**31 - 1, (words,), generator=gen, dtype=torch.int32, device=ctx.device)
    buf.copy_(src)
    _inject(buf, stuck)
    mismatches += int((buf != src).sum().item())
    patterns += 1
    # Device-to-device: copy one half onto the other; bytes moved = bytes copied (nvbandwidth's convention).
    half = words // 2
    lo, hi = buf[:half], buf[half : 2 * half]
    seconds = ctx.timed(lambda: hi.copy_(lo), repeat=5)
    d2d = half * WORD_BYTES / seconds * ctx.faults.d2d_factor
    return {
        "bytes": words * WORD_BYTES,
        "words": words,
        "patterns": patterns,
        "mismatched_words": mismatches,
        "d2d_bytes_per_second": finite(d2d),
    }


def _as_int32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _stuck_words(ctx: ProbeContext, words: int) -> Any:
    n = ctx.faults.stuck_bits
    if not n:
        return None
    gen = ctx.torch.Generator().manual_seed(SEED + 1)
    return ctx.torch.randperm(words, generator=gen)[: min(n, words)].to(ctx.device)


def _inject(buf: Any, stuck: Any) -> None:
    """A stuck-at-1 data bit in the injected words: every pattern without that bit reads back wrong."""
    if stuck is not None:
        buf[stuck] = buf[stuck] | STUCK_BIT
