"""A bound on the series of one metric family whose label values come from outside (the kernel log, NVML events).

50,000 distinct Xid codes or 30,000 forged PCI addresses in the kernel log would otherwise each become a series
that lives until the daemon stops. Past :data:`MAX_SERIES_PER_FAMILY` keys a counter dict takes no new key; the
event is counted in ``dropped[family]`` (exported as ``gpuwatchd_series_dropped_total{family}``) and the keys it
already has keep counting.
"""

from __future__ import annotations

from typing import TypeVar

# 64 GPUs x 16 Xid codes each, or (uuid, xid, source) for 64 GPUs x 8 codes x 2 sources: more than any real host
# shows, and a /metrics that still renders in milliseconds.
MAX_SERIES_PER_FAMILY = 1024

K = TypeVar("K")


def bump(counts: dict[K, int], key: K, dropped: dict[str, int], family: str, by: int = 1) -> bool:
    """``counts[key] += by`` unless ``key`` is new and ``counts`` is full; False (and counted) when dropped."""
    if key not in counts and len(counts) >= MAX_SERIES_PER_FAMILY:
        dropped[family] = dropped.get(family, 0) + by
        return False
    counts[key] = counts.get(key, 0) + by
    return True
