"""Waiting on an event with a timeout without losing a cancellation.

``asyncio.wait_for`` on Python < 3.12 can swallow a ``cancel()`` that arrives while the awaited event is being set
(cpython#86296): the caller then loops on as if nothing happened, and a stop never completes. ``asyncio.wait`` does
not have that race, so timed event waits go through here.
"""

from __future__ import annotations

import asyncio


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
