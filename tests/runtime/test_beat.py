"""runtime/beat.py: a beat many waiters ride on, each with its own timeout, and the watches' next turn."""

from __future__ import annotations

import asyncio

from gpuwatchd.runtime.beat import GRACE_RATIO, Beat, next_turn

WAIT = 30.0  # upper bound for anything to happen; tests normally finish far sooner


async def test_a_fire_wakes_every_waiter_and_a_timeout_reads_false() -> None:
    beat = Beat()
    assert await beat.wait(0.01) is False
    waiters = [asyncio.create_task(beat.wait(WAIT)) for _ in range(3)]
    await asyncio.sleep(0)  # all three are waiting
    beat.fire()
    assert await asyncio.wait_for(asyncio.gather(*waiters), WAIT) == [True, True, True]
    assert beat.fired == 1 and beat._waiters == []


async def test_a_fire_with_nobody_waiting_is_not_remembered() -> None:
    beat = Beat()
    beat.fire()
    assert await beat.wait(0.01) is False  # unlike asyncio.Event: the next wait waits for the next beat
    assert beat.fired == 1


async def test_a_wait_leaves_no_timer_or_waiter_behind() -> None:
    """Each wait's timer is cancelled however it ends, so a waiter riding a beat a second for days does not grow
    the loop's timer heap, and a cancelled waiter is not woken (nor kept) by a later fire."""
    loop = asyncio.get_running_loop()
    beat = Beat()
    for _ in range(50):
        task = asyncio.create_task(beat.wait(3600.0))
        await asyncio.sleep(0)
        beat.fire()
        assert await task is True
    task = asyncio.create_task(beat.wait(3600.0))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task}, timeout=WAIT)
    assert task.cancelled() and beat._waiters == []
    beat.fire()
    live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert not any(h.when() > loop.time() + 3000 for h in live)


async def test_cancel_arriving_with_the_fire_is_not_lost() -> None:
    """The beat is fired and the waiting task cancelled in the same loop iteration: the task still ends (the
    cpython#86296 race that runtime/waits.py guards against for asyncio.Event)."""
    beat = Beat()
    turns = 0

    async def rider() -> None:
        nonlocal turns
        while True:
            turns += 1
            await beat.wait(WAIT)

    for _ in range(200):
        task = asyncio.create_task(rider())
        await asyncio.sleep(0)
        beat.fire()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=WAIT)
        assert task in done and task.cancelled()
    assert turns >= 200


async def test_next_turn_rides_the_beat_and_keeps_the_floor() -> None:
    """A period far longer than the test: only the beat can end the wait. After the beat, what is left of the
    floor since the last turn is still waited (``sim --speed`` lines can come faster than the floor)."""
    loop = asyncio.get_running_loop()
    beat = Beat()
    last = loop.time()
    turn = asyncio.create_task(next_turn(beat, 3600.0, 0.3, last))
    await asyncio.sleep(0)
    beat.fire()
    await asyncio.wait_for(turn, WAIT)
    assert loop.time() - last >= 0.3 - 0.01  # the floor (less the loop's clock resolution)
    last = loop.time() - 10.0  # the floor passed long ago: the beat alone ends the turn
    turn = asyncio.create_task(next_turn(beat, 3600.0, 0.3, last))
    await asyncio.sleep(0)
    beat.fire()
    await asyncio.wait_for(turn, WAIT)


async def test_next_turn_without_a_beat_or_under_the_floor_sleeps_as_before() -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await next_turn(None, 0.05, 0.2, t0)  # no beat: max(period, floor)
    assert loop.time() - t0 >= 0.2 - 0.01
    beat = Beat()
    t0 = loop.time()
    turn = asyncio.create_task(next_turn(beat, 0.05, 0.2, t0))  # period under the floor: the beat is not used
    await asyncio.sleep(0)
    beat.fire()
    await asyncio.wait_for(turn, WAIT)
    assert loop.time() - t0 >= 0.2 - 0.01


async def test_next_turn_runs_on_its_own_when_no_beat_comes() -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(next_turn(Beat(), 0.2, 0.05, t0), WAIT)
    assert loop.time() - t0 >= 0.2 * (1 + GRACE_RATIO) - 0.01
