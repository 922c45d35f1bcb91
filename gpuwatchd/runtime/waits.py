"""Waiting on an event with a timeout without losing a cancellation.

``asyncio.wait_for`` on Python < 3.12 can swallow a ``cancel()`` that arrives while the awaited event is being set
(cpython#86296): the caller then loops on as if nothing happened, and a stop never completes. ``asyncio.wait`` does
not have that race, so timed event waits go through here.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from gpuwatchd.runtime.clock import Clock

T = TypeVar("T")

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


async def within(timeout: float, start: Callable[[], Awaitable[T]]) -> T:
    """``await start()`` within ``timeout`` real seconds, else :class:`TimeoutError` (``asyncio.TimeoutError``).

    What ``asyncio.wait_for(start(), timeout)`` does, without the task it creates for every call on Python < 3.12
    (the supervisor reads each worker line this way). On 3.11+ it is ``asyncio.timeout``, which is what
    ``wait_for`` itself runs on 3.12+; on 3.10 it is ``wait_for``. A timeout of 0 or less fails at once without
    starting the read, as ``wait_for`` does (it cancels the read's task before it runs); data not read stays
    buffered for the next call either way.
    """
    if timeout <= 0:
        await asyncio.sleep(0)  # wait_for yields once too (cancelling the read's task)
        raise asyncio.TimeoutError
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await start()
    return await asyncio.wait_for(start(), timeout)


async def nap(clock: Clock, until: float, wake: asyncio.Event, max_nap: float = MAX_NAP_SECONDS) -> None:
    """Sleep until clock time ``until`` (at most ``max_nap`` real seconds) or until ``wake`` is set."""
    real = max(0.0, until - clock.now()) / clock.speed
    if real <= 0:
        await asyncio.sleep(0)
        return
    await wait_event(wake, min(real, max_nap))
    wake.clear()
