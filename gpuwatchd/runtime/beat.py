"""A beat that periodic work rides on: the supervisor fires it after each worker line reached the store, and the
1 Hz sysfs watches (hot-plug and links, Thunderbolt docks) wait on it with a timeout, so their reads run in the
wake-up that line already cost instead of each in a wake-up of its own.

On this project's 2-core VM a task waking from ``asyncio.sleep`` once a second costs ~0.25-0.29 ms of CPU a second
even when it does nothing (cold caches, the loop's iteration, the timer), while tasks woken in the same loop
iteration share that cost (~0.02 ms each): at 8 GPUs x 32 processes the two watches' own wake-ups were an eighth of
the daemon and its worker together (docs/performance.md, "8x32").

Unlike :class:`asyncio.Event`, a fire while nobody waits is not remembered: a waiter that was busy misses that beat
and catches the next one, or its timeout. A waiter never needs the beat to make progress; its timeout is its
schedule when no line comes (no driver, a hung worker, a GPU-less host).
"""

from __future__ import annotations

import asyncio

__all__ = ["GRACE_RATIO", "Beat", "next_turn"]


def _time_out(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class Beat:
    """Wakes every task in :meth:`wait` when :meth:`fire` is called. Not thread-safe: one event loop."""

    __slots__ = ("_waiters", "fired")

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[bool]] = []
        self.fired = 0  # beats so far (tests, and a waiter that wants to know whether one came)

    def fire(self) -> None:
        """Wake the current waiters (their wait returns True); a waiter that comes later waits for the next."""
        self.fired += 1
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(True)

    async def wait(self, timeout: float) -> bool:
        """Until the next :meth:`fire` (True) or ``timeout`` real seconds (False). Cancellation propagates.

        One future and one timer a wait, no task (``wait_event``'s ``asyncio.wait`` makes both and a task): a
        cancel while the beat is being fired still raises here, as the task's cancel is delivered at its next step.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(max(0.0, timeout), _time_out, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            if not fut.done():
                fut.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)


# How much longer than its period a waiter gives the beat before it runs on its own: lines come one poll interval
# apart, a few milliseconds either side (the same reason as the evaluation timer's SNAPSHOT_GRACE).
GRACE_RATIO = 0.1


async def next_turn(beat: Beat | None, period: float, floor: float, last: float) -> None:
    """Wait for the next turn of work done every ``period`` real seconds, at least ``floor`` apart; ``last`` is the
    loop time the previous turn started (``loop.time()``).

    With a beat and a period above the floor: the next beat, or ``period`` x (1 + :data:`GRACE_RATIO`) without one,
    then whatever is left of ``floor`` since ``last``. Otherwise (no beat; ``sim --speed`` compressing the period
    below the floor) a sleep of ``max(period, floor)``, as the watches always slept.
    """
    if beat is None or period <= floor:
        await asyncio.sleep(max(period, floor))
        return
    await beat.wait(period * (1 + GRACE_RATIO))
    rest = floor - (asyncio.get_running_loop().time() - last)
    if rest > 0:
        await asyncio.sleep(rest)
