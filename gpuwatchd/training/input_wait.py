"""How long each training step waited for its input: a wrapper around the data loader's iterator.

``for batch in gpuwatchd.training.wrap_input(loader): ...`` times each ``next()`` (the wait for a batch) against
the wall time between reports; the reporter reads and resets it every interval. Cost: two ``perf_counter`` calls and
a lock per batch, far below a step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class InputWaitMeter:
    """Seconds spent waiting in ``next()`` since the last :meth:`take`, over the wall time since then."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._waited = 0.0
        self._since: float | None = None  # start of the window: the last take, or the first wait after start
        self._batches = 0

    def add(self, started: float, ended: float) -> None:
        with self._lock:
            if self._since is None:
                self._since = started
            self._waited += ended - started
            self._batches += 1

    def take(self) -> float | None:
        """The share of the window spent waiting for input (0..1), None when no batch was fetched in it; starts a
        new window."""
        now = self._clock()
        with self._lock:
            since, waited, batches = self._since, self._waited, self._batches
            self._since, self._waited, self._batches = now, 0.0, 0
        if batches == 0 or since is None or now <= since:
            return None
        return min(1.0, max(0.0, waited / (now - since)))

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable``, timing each ``next()``."""
        it = iter(iterable)
        clock = self._clock
        while True:
            started = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            self.add(started, clock())
            yield item
