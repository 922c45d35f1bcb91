"""runtime/waits.py: a timed event wait that never swallows a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gpuwatchd.runtime.waits import wait_event, within


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


async def test_within_reads_a_line_or_times_out_keeping_what_is_buffered() -> None:
    """As ``asyncio.wait_for(reader.readline(), timeout)``: the line when it comes in time, TimeoutError when it
    does not (a partial line stays buffered for the next read), at once for a timeout of 0 or less (nothing read,
    even with a line waiting) and no task left behind."""
    reader = asyncio.StreamReader()
    reader.feed_data(b"first\n")
    assert await within(5.0, reader.readline) == b"first\n"
    reader.feed_data(b"par")
    with pytest.raises(asyncio.TimeoutError):
        await within(0.02, reader.readline)
    reader.feed_data(b"tial\n")
    with pytest.raises(asyncio.TimeoutError):
        await within(0.0, reader.readline)
    with pytest.raises(asyncio.TimeoutError):
        await within(-1.0, reader.readline)
    assert await within(5.0, reader.readline) == b"partial\n"
    asyncio.get_running_loop().call_later(0.01, reader.feed_data, b"late\n")
    assert await within(30.0, reader.readline) == b"late\n"
    reader.feed_data(b"x" * 10)
    reader.feed_eof()
    assert await within(5.0, reader.readline) == b"x" * 10
    assert await within(5.0, reader.readline) == b""
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_within_passes_a_cancel_from_outside_on() -> None:
    reader = asyncio.StreamReader()
    task = asyncio.ensure_future(within(30.0, reader.readline))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reader.feed_data(b"kept\n")
    assert await within(5.0, reader.readline) == b"kept\n"
