"""stall_watch.watch with a poller thread of its own: how often it wakes between polls, and that a call that blocks
is still set aside, with and without the poller's planned start (``next_start``)."""

from __future__ import annotations

import threading
import time

from gpuwatchd.sources.nvml.protocol import NOT_IN_A_GPU_CALL
from gpuwatchd.sources.nvml.worker.stall_watch import Position, Stuck, watch

INTERVAL = 0.3
STALL_AFTER = 0.4  # a check period of 0.1 s (stall_watch.check_period)


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


class Poller:
    """A poller as worker/main.py's: a poll of a few calls on one GPU, then a sleep to the next planned start."""

    def __init__(self, polls: int, block_in_poll: int | None = None, block_seconds: float = 0.0) -> None:
        self.pos = Position(0)
        self.activity = CountingEvent()
        self.done = threading.Event()
        self.next_start: float | None = None
        self.looks = 0
        self.set_aside: list[tuple[Position, float]] = []
        self._polls, self._block_in, self._block_s = polls, block_in_poll, block_seconds

    def current(self) -> Position:
        self.looks += 1
        return self.pos

    def aside(self, pos: Position, blocked: float) -> None:
        """As the worker's set_aside: the call is left to its thread and another generation polls on (here the
        same thread, which polls on at the new generation's position once its call returns)."""
        self.set_aside.append((pos, blocked))
        self.pos = Position(pos.gen + 1)

    def run(self) -> None:
        for n in range(self._polls):
            started = time.monotonic()
            pos = self.pos
            pos.index = 0
            pos.seq += 1
            self.activity.set()
            time.sleep(self._block_s if n == self._block_in else 0.003)  # the GPU's calls
            pos.index = NOT_IN_A_GPU_CALL
            pause = max(0.0, INTERVAL - (time.monotonic() - started))
            self.next_start = time.monotonic() + pause
            time.sleep(pause)
        self.done.set()
        self.activity.set()


def _run(p: Poller, *, planned: bool) -> None:
    t = threading.Thread(target=p.run, daemon=True)
    t.start()
    watch(p.current, dict[int, Stuck], p.aside, p.done,
          STALL_AFTER, activity=p.activity, next_start=(lambda: p.next_start) if planned else None)
    t.join(30)


def test_one_look_a_poll_with_the_planned_start() -> None:
    """Without the plan the watch wakes at each poll's start and a check period later; with it, only the second
    time. Counted loosely: a poller starved for more than a check period falls back to the event, so a loaded
    machine may add a few."""
    polls = 12
    without, with_plan = Poller(polls), Poller(polls)
    _run(without, planned=False)
    _run(with_plan, planned=True)
    # asleep on the event between two polls (all of them on an idle machine; a watch late by a whole interval
    # finds the next poll already under way and skips one)
    assert without.activity.waits >= polls // 2
    assert with_plan.activity.waits <= polls // 3  # the first poll (no plan yet), and any the poller was late for
    assert with_plan.set_aside == [] and without.set_aside == []


def test_a_blocked_call_is_set_aside_with_the_planned_start() -> None:
    """The fourth poll's call blocks for 2 s: set aside once it has blocked STALL_AFTER, timed from the watch's
    first look into the poll (a check period in), with the plan as without it."""
    for planned in (True, False):
        p = Poller(6, block_in_poll=3, block_seconds=2.0)
        _run(p, planned=planned)
        assert len(p.set_aside) == 1, planned
        pos, blocked = p.set_aside[0]
        assert pos.gen == 0 and p.pos.gen == 1 and STALL_AFTER <= blocked < 2.0
