"""Garbage-collector tuning for the daemon: keep full (generation-2) collections off the steady polling path.

Why: every poll builds thousands of small objects (samples, per-process rows) that the store keeps for its history
window, so they age into the oldest generation. CPython runs a full collection once that generation has grown by a
quarter, and a full collection walks every tracked object the daemon holds: at 16 GPUs x 256 processes that was a
56-179 ms pause every ~3 s, and most slow `/metrics` answers overlapped one (issue 20's measurements).

What: after start-up (imports, config, the first snapshots) the objects that survived a young collection are moved
to the permanent generation (``gc.freeze()``), which the collector never scans. That is safe for what the daemon
keeps: history rows are acyclic and are freed by reference counting when they leave their window, frozen or not (a
frozen object is only exempt from the *cycle* search).

Freezing alone does not stop full collections: CPython starts one after every 10 young (generation-1) collections
once the oldest generation has grown by a quarter of its size at the last full collection, and with the history
frozen that size is small, so under scrapers a full collection still ran every few seconds (7-8 in 20 s at 16 x 256
with 10 scrapers, bench/gc_tail.py). So from then on the automatic full collection is off
(:func:`hold_full_collections`), and every ``interval`` seconds :func:`keep_frozen` runs the one full collection
itself, over what is not frozen (what survived since the last freeze, not the history), then freezes the survivors.
The cycles made since the last freeze are found there, before they are frozen; ``bench/footprint.py``'s soak
measures what is left (``rss_growth_mb``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)

# Re-freeze often enough that the oldest generation never grows by the quarter that triggers a full collection
# between two freezes at 16 x 256 (~4k objects a poll, ~60 s to reach the default trigger after a freeze).
FREEZE_INTERVAL_SECONDS = 30.0


# Generation-1 collections between automatic full collections once they are held: never, in practice.
HELD_THRESHOLD = 1 << 30


def freeze_survivors(generation: int = 1) -> None:
    """Collect up to ``generation`` (1: the young ones; 2: all, the frozen excepted), then move every surviving
    tracked object out of the collector's reach."""
    gc.collect(generation)
    gc.freeze()


@contextlib.contextmanager
def paused(*, freeze: bool = False) -> Iterator[None]:
    """No collection while the block runs, then the collector as it was; with ``freeze``, what the block made (and
    everything else tracked) is frozen at its end without a collection walking it.

    For a bulk load of acyclic objects that all live on: the rule history restored at start, ~3 M points at 16 x
    256 with an hour, during which young and full collections kept walking what had been loaded (4.2 of the 6.7 s
    its decoding took, bench/restart_save.py). A cycle made in the block is found by the next collection, or, once
    frozen, never: the block must make none that becomes garbage."""
    was = gc.isenabled()
    if freeze:
        gc.collect(1)  # as freeze_survivors: young garbage (a cycle from the imports, say) is not frozen for good
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


def hold_full_collections() -> None:
    """No automatic full collection from now on (young collections run as before): :func:`keep_frozen` runs them."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, HELD_THRESHOLD)


async def keep_frozen(interval: float = FREEZE_INTERVAL_SECONDS) -> None:
    """Run forever: hold the automatic full collections, and every ``interval`` seconds of real time collect what
    is not frozen and freeze the survivors."""
    hold_full_collections()
    while True:
        await asyncio.sleep(interval)
        freeze_survivors(2)
        if log.isEnabledFor(logging.DEBUG):  # counting walks every frozen object (~1 M at 16 x 256)
            log.debug("gc: %d objects frozen", gc.get_freeze_count())
