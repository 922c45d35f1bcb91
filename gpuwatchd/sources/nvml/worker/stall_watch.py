"""Inside the NVML worker: sets aside a GPU whose NVML call blocks, so the other GPUs keep their schedule.

The worker polls in a poller thread; the worker's main thread runs :func:`watch`. When the poller has been inside
one GPU's calls for ``stall_after`` seconds, that GPU is set aside (:class:`Stuck`, reported lost with reason
``hang_suspected``) and a fresh poller thread takes over the others at once: a blocked C call cannot be
interrupted, but nothing has to wait for it. The abandoned thread stays in its call; when the call returns the
GPU is polled again (no respawn, no retry that could block the healthy GPUs). A GPU whose call has blocked for
``hang_after`` seconds is reported with reason ``timeout`` (hung, not only suspected).

Only time the worker process was running counts against a GPU: each watchdog wake-up adds at most one check
period, so a worker stopped (SIGSTOP) or starved of CPU for seconds does not make a GPU look hung when it resumes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from gpuwatchd.sources.nvml.protocol import NOT_IN_A_GPU_CALL

# Watchdog period bounds (real seconds): a quarter of stall_after, clamped. Only while a poll is in a GPU's
# calls or a GPU is stuck; between polls the watch sleeps on the poller's activity event (see watch).
MIN_CHECK_SECONDS = 0.01
MAX_CHECK_SECONDS = 0.1


class Position:
    """Where one poller thread is: its generation, the GPU it is calling (or NOT_IN_A_GPU_CALL), calls entered."""

    __slots__ = ("gen", "index", "seq")

    def __init__(self, gen: int) -> None:
        self.gen = gen
        self.index = NOT_IN_A_GPU_CALL
        self.seq = 0


class Stuck:
    """A GPU set aside because a call on it blocks; ``pos`` is the abandoned thread still inside that call.

    A plain class, not a dataclass: ``dataclasses`` brings ``inspect`` (~1 MB) into the worker for this alone."""

    __slots__ = ("blocked", "index", "pci_bus_id", "pos", "uuid")

    def __init__(self, index: int, pos: Position, uuid: str | None, pci_bus_id: str | None, blocked: float) -> None:
        self.index = index
        self.pos = pos
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.blocked = blocked  # seconds the worker was running while the call blocked

    def __repr__(self) -> str:
        return (f"Stuck(index={self.index}, pos={self.pos!r}, uuid={self.uuid!r}, pci_bus_id={self.pci_bus_id!r}, "
                f"blocked={self.blocked})")


def check_period(stall_after: float) -> float:
    return min(max(stall_after / 4, MIN_CHECK_SECONDS), MAX_CHECK_SECONDS)


def watch(
    current: Callable[[], Position],
    stuck: Callable[[], Mapping[int, Stuck]],
    set_aside: Callable[[Position, float], None],
    done: threading.Event,
    stall_after: float,
    *,
    activity: threading.Event | None = None,
    next_start: Callable[[], float | None] | None = None,
) -> None:
    """Until ``done``: time the current poller's call and every stuck call; set aside a call past ``stall_after``.

    With ``activity`` (set by the poller when it enters a GPU's calls, after moving its position), the watch
    sleeps on it while the poller is between polls and nothing is stuck: a few wake-ups per poll instead of one
    every check period for the whole interval. The event is cleared BEFORE the position is read, so a call
    entered after that read sets it again and the wait returns at once. Whoever sets ``done`` sets it too.

    With ``next_start`` too (the ``time.monotonic()`` the poller plans to start its next poll, published before
    it sleeps; None when unknown), the watch does not wake when the poll starts: it sleeps until one check period
    into the poll and looks then, which is when it would have looked first anyway (after waking at the start, it
    waited a period). A poll done by then (most take milliseconds) costs the watch that one wake-up instead of two
    (``bench/wakeups.py``, ``thread_one``/``thread_two``); a poll still in a call is timed from there exactly as
    before. A poller later than it planned is waited for on ``activity``, as without ``next_start``.
    """
    check = check_period(stall_after)
    seen: tuple[int, int] = (-1, -1)
    blocked = 0.0
    last = time.monotonic()
    while not done.is_set():
        if activity is not None and not stuck():
            activity.clear()
            if current().index == NOT_IN_A_GPU_CALL:
                planned = next_start() if next_start is not None else None
                wake = planned + check - time.monotonic() if planned is not None else 0.0
                if wake > 0:
                    if done.wait(wake):
                        break
                    last = time.monotonic()
                    pos = current()
                    # In a call: this is the first look, as after a wake at the start and a check period.
                    seen = (pos.gen, pos.seq) if pos.index != NOT_IN_A_GPU_CALL else (-1, -1)
                    blocked = 0.0
                    continue
                activity.wait()
                seen, blocked, last = (-1, -1), 0.0, time.monotonic()
                continue
        if done.wait(check):
            break
        now = time.monotonic()
        alive = min(now - last, 2 * check)  # a stopped or starved process does not count against a GPU
        last = now
        for st in list(stuck().values()):
            st.blocked += alive
        pos = current()
        if pos.index == NOT_IN_A_GPU_CALL or (pos.gen, pos.seq) != seen:
            seen, blocked = (pos.gen, pos.seq), 0.0
            continue
        blocked += alive
        if blocked >= stall_after:
            set_aside(pos, blocked)
            seen, blocked = (-1, -1), 0.0
