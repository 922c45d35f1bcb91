"""The daemon's clock. Real time by default; ``gpuwatchd sim --speed X`` runs it X times faster from a start.

Everything that stamps or compares times (store, rules, dispatcher) takes a ``Clock`` so the scenario clock and
the daemon's clock are one and the same, and tests can drive time by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds (``now``) plus a sleep measured in the same seconds."""

    speed: float

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Unix time."""

    speed = 1.0

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ScaledClock:
    """Starts at ``start`` and runs ``speed`` times faster than the monotonic clock."""

    def __init__(self, start: float | None = None, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed = speed
        self._start = time.time() if start is None else start
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._t0) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)


class ManualClock:
    """A clock tests move by hand; ``sleep`` advances it and yields once."""

    speed = 1.0

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    async def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)


def wall_mapper(clock: Clock) -> Callable[[float], float] | None:
    """For a clock that runs faster than real time (``gpuwatchd sim --speed``), map its times onto the wall clock,
    keeping their distance from now in real seconds; None for a clock at real speed (nothing to map).

    For a peer that judges our timestamps by its own clock: Alertmanager keeps an alert active until its
    ``endsAt``, so a resolution stamped on a sim clock hours ahead of the wall stayed "active" there for hours.
    """
    if clock.speed == 1.0:
        return None
    now, wall, speed = clock.now(), time.time(), clock.speed
    return lambda t: wall - (now - t) / speed

