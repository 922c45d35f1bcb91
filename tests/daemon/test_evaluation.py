"""The rules' evaluation loop: after every wake (a snapshot), and on its timer while nothing wakes it."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from gpuwatchd.daemon.evaluation import MIN_EVAL_INTERVAL, SNAPSHOT_GRACE, Evaluation
from gpuwatchd.model import Alert

SPEED = 20.0  # clock seconds per real second: the 1 s timer every 50 ms


class _Loop(Evaluation):
    """The loop alone: ``evaluate`` records the real time of each evaluation instead of running the rules."""

    def __init__(self) -> None:  # no DaemonParts: only what the loop reads
        self.config: Any = SimpleNamespace(nvml=SimpleNamespace(poll_interval=1.0))
        self.clock: Any = SimpleNamespace(speed=SPEED)
        self.wake = self._wakeup = asyncio.Event()
        self.times: list[float] = []

    def evaluate(self) -> list[Alert]:
        self.times.append(time.monotonic())
        return []


async def test_the_timer_evaluates_while_no_snapshot_comes_and_a_wake_evaluates_at_once() -> None:
    loop = _Loop()
    task = asyncio.create_task(loop._evaluate_loop())
    try:
        for _ in range(200):  # no wake at all: the timer alone evaluates, again and again
            await asyncio.sleep(0.05)
            if len(loop.times) >= 3:
                break
        assert len(loop.times) >= 3
        # a wake (a snapshot) evaluates without waiting for the timer
        before = len(loop.times)
        woke = time.monotonic()
        loop.wake.set()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if any(t >= woke for t in loop.times[before:]):
                break
        assert any(t >= woke for t in loop.times[before:])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_after_a_wake_the_timer_waits_a_grace_longer() -> None:
    """A snapshot due one interval after the last is not preceded by a timer evaluation that saw nothing new: the
    timer's first wait after a wake is the interval plus the grace; its waits after a timer evaluation are the
    interval. Real gaps can only be longer than asked (a busy machine): checked from below."""
    loop = _Loop()
    loop.clock.speed = 2.0  # the interval: 0.5 s real, the grace 50 ms
    task = asyncio.create_task(loop._evaluate_loop())
    try:
        await asyncio.sleep(0.01)
        loop.wake.set()
        for _ in range(400):  # the woken evaluation, then two of the timer
            await asyncio.sleep(0.01)
            if len(loop.times) >= 3:
                break
        assert len(loop.times) >= 3
        first = loop.times[1] - loop.times[0]  # the timer's wait after the woken evaluation
        assert first >= (MIN_EVAL_INTERVAL + SNAPSHOT_GRACE) / 2.0 - 0.005
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
