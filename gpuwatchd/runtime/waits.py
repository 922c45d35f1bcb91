"""Waiting on an event with a timeout without losing a cancellation.

``asyncio.wait_for`` on Python < 3.12 can swallow a ``cancel()`` that arrives while the awaited event is being set
(cpython#86296): the caller then loops on as if nothing happened, and a stop never completes. ``asyncio.wait`` does
not have that race, so timed event waits go through here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwatchd.runtime.clock import Clock

# Longest real-time nap of a waiting worker: bounds how late it notices a clock that jumps (ManualClock, tests).
MAX_NAP_SECONDS = 0.5


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` real seconds pass; True if it was set. Cancellation propagates."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()


async def nap(clock: Clock, until: float, wake: asyncio.Event, max_nap: float = MAX_NAP_SECONDS) -> None:
    """Sleep until clock time ``until`` (at most ``max_nap`` real seconds) or until ``wake`` is set."""
    real = max(0.0, until - clock.now()) / clock.speed
    if real <= 0:
        await asyncio.sleep(0)
        return
    await wait_event(wake, min(real, max_nap))
    wake.clear()
