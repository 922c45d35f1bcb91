"""Which processes' series are flat, kept from one leak evaluation to the next so that a flat one is not read whole.

A series whose readings hold at most one distinct value cannot be judged: ``_judge_series`` returns None for fewer
than two points or a spread under ``MIN_SCATTER`` (2 MiB, more than 0), so the process adds no condition. Most
processes are flat, and reading each one's whole history (up to 720 points) every evaluation only to find that was
most of the leak family's cost: at 16 GPUs x 256 processes with an hour of history, ~700 ms of CPU on the event
loop every 15 s (issue 20, docs/performance.md).

So per process this keeps the newest settled point it has read (``Store.process_history_after``'s anchor: a ring
only appends and drops its oldest, and its settled points never change) and what the readings up to it held: no
value, one value, or several. Each evaluation folds in only the points after the anchor, and the newest point
(which may still change) without keeping it. A process whose judged series hold several values is forgotten and
read whole next time, so it becomes flat again once its last change leaves the window; an anchor no longer in the
ring (a new ring, another store) means a whole read too. The answer is always the one the whole history gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuwatchd.store import ProcessPoint

_EMPTY: Any = object()  # no reading yet
_MIXED: Any = object()  # more than one distinct reading

# (uuid, pid) -> (anchor point, GPU memory readings, host RSS readings): each _EMPTY, the one value, or _MIXED
_Memo = dict[tuple[str, int], tuple[object, Any, Any]]


def _fold(state: Any, value: int | None) -> Any:
    if value is None or state is _MIXED:
        return state
    if state is _EMPTY:
        return value
    return state if state == value else _MIXED


class FlatSeries:
    """The memo of one store's process series; ``flat`` answers per process, ``done`` drops the processes not asked
    about since the last ``done``."""

    def __init__(self) -> None:
        self._memo: _Memo = {}
        self._next: _Memo = {}

    def flat(self, view: object, uuid: str, pid: int, host_rss: bool) -> bool:
        """True when the process' GPU memory series (and its host RSS series, with ``host_rss``) holds at most one
        distinct value: no leak condition can come of it. False when unsure (a view without
        ``process_history_after``)."""
        after: Callable[[str, int, object], tuple[Sequence[ProcessPoint], bool, int]] | None = getattr(
            view, "process_history_after", None)
        if after is None:
            return False
        key = (uuid, pid)
        memo = self._memo.get(key)
        points, found, mutable = after(uuid, pid, memo[0] if memo is not None else None)
        if memo is not None and found:
            anchor, used, rss = memo
        else:
            anchor, used, rss = None, _EMPTY, _EMPTY
        settled = len(points) - mutable
        for i in range(settled):
            p = points[i]
            used = _fold(used, p.used_memory_bytes)
            rss = _fold(rss, p.host_rss_bytes)
        if settled > 0:
            anchor = points[settled - 1]
        if used is not _MIXED and (not host_rss or rss is not _MIXED):
            self._next[key] = (anchor, used, rss)
        for i in range(settled, len(points)):
            p = points[i]
            used = _fold(used, p.used_memory_bytes)
            rss = _fold(rss, p.host_rss_bytes)
        return used is not _MIXED and (not host_rss or rss is not _MIXED)

    def done(self) -> None:
        self._memo, self._next = self._next, {}
