"""runtime/waits.py: a timed event wait that never swallows a cancellation."""

from __future__ import annotations

import asyncio

from gpuwatchd.runtime.waits import wait_event


async def test_returns_true_when_set_and_false_on_timeout() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.01) is False
    asyncio.get_running_loop().call_soon(ev.set)
    assert await wait_event(ev, 30.0) is True


async def test_cancel_arriving_with_the_set_is_not_lost() -> None:
    """The cpython#86296 race: the event is set and the waiting task cancelled in the same loop iteration.

    A loop that naps until cancelled must end; with ``asyncio.wait_for`` on 3.11 it could go on forever."""
    ev = asyncio.Event()
    naps = 0

    async def napper() -> None:
        nonlocal naps
        while True:
            naps += 1
            await wait_event(ev, 30.0)
            ev.clear()

    for _ in range(200):
        task = asyncio.create_task(napper())
        await asyncio.sleep(0)  # the napper is now waiting
        ev.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=30.0)
        assert task in done and task.cancelled()
    assert naps >= 200
