"""Garbage-collector tuning for the daemon: keep full (generation-2) collections off the steady polling path.

Why: every poll builds thousands of small objects (samples, per-process rows) that the store keeps for its history
window, so they age into the oldest generation. CPython runs a full collection once that generation has grown by a
quarter, and a full collection walks every tracked object the daemon holds: at 16 GPUs x 256 processes that was a
56-179 ms pause every ~3 s, and most slow `/metrics` answers overlapped one (issue 20's measurements).

What: after start-up (imports, config, the first snapshots) and then every ``interval`` seconds, the objects that
survived a young collection are moved to the permanent generation (``gc.freeze()``), which the collector never
scans. That is safe for what the daemon keeps: history rows are acyclic and are freed by reference counting when
they leave their window, frozen or not (a frozen object is only exempt from the *cycle* search). What a freeze could
keep alive is cyclic garbage that had already reached the oldest generation before the freeze; the young
collection run just before each freeze clears the cycles made since the last one, and ``bench/footprint.py``'s soak
measures what is left (``rss_growth_mb``).
"""

from __future__ import annotations

import asyncio
import gc
import logging

log = logging.getLogger(__name__)

# Re-freeze often enough that the oldest generation never grows by the quarter that triggers a full collection
# between two freezes at 16 x 256 (~4k objects a poll, ~60 s to reach the default trigger after a freeze).
FREEZE_INTERVAL_SECONDS = 30.0


def freeze_survivors() -> int:
    """Collect the young generations, then move every surviving tracked object out of the collector's reach.

    Returns the number of objects now frozen in total.
    """
    gc.collect(1)
    gc.freeze()
    return gc.get_freeze_count()


async def keep_frozen(interval: float = FREEZE_INTERVAL_SECONDS) -> None:
    """Run forever: freeze the long-lived survivors every ``interval`` seconds of real time."""
    while True:
        await asyncio.sleep(interval)
        frozen = freeze_survivors()
        log.debug("gc: %d objects frozen", frozen)
