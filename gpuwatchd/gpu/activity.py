"""Whether a GPU was busy at any moment of a window: every snapshot's utilization and compute pids, folded into
``step``-wide buckets (max utilization, union of pids), kept for ``retention`` (no I/O).

The store's per-GPU history keeps one point per ``step`` (5 s), so a poll between two kept points is overwritten
and a short job, or a process seen in one poll only, leaves no trace there. Idleness needs the opposite guarantee
(nothing happened in the whole window), so this log loses no snapshot: a bucket's ``max_util`` is the largest
reading of every poll it covers and ``pids`` every compute process any of them listed. The probe scheduler reads it
(gpuwatchd/probes/scheduler.py). Bounded: retention/step buckets per GPU (720 at the defaults).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Bucket:
    start: float  # first poll folded in
    end: float  # last poll folded in
    max_util: float | None  # None: no poll in it had a utilization reading
    pids: set[int] = field(default_factory=set)  # compute processes any poll in it listed


class ActivityLog:
    def __init__(self, step: float, retention: float) -> None:
        self.step = step
        self.retention = retention
        self._gpus: dict[str, deque[Bucket]] = {}

    def add(self, uuid: str, t: float, util: float | None, pids: Iterable[int]) -> None:
        buckets = self._gpus.get(uuid)
        if buckets is None:
            buckets = self._gpus[uuid] = deque()
        last = buckets[-1] if buckets else None
        if last is not None and t - last.start < self.step and t >= last.end:
            last.end = t
            if util is not None:
                last.max_util = util if last.max_util is None else max(last.max_util, util)
            last.pids.update(pids)
        else:
            buckets.append(Bucket(t, t, util, set(pids)))
        horizon = t - self.retention
        while buckets and buckets[0].end < horizon:
            buckets.popleft()

    def first_seen(self, uuid: str) -> float | None:
        """The oldest poll still kept for the GPU (None: never seen)."""
        buckets = self._gpus.get(uuid)
        return buckets[0].start if buckets else None

    def since(self, uuid: str, t0: float) -> Sequence[Bucket]:
        """Buckets with a poll at or after ``t0``, oldest first (a bucket straddling ``t0`` is included whole: the
        window is judged on the safe side, up to ``step`` longer)."""
        buckets = self._gpus.get(uuid)
        if not buckets:
            return ()
        out: list[Bucket] = []
        for b in reversed(buckets):
            if b.end < t0:
                break
            out.append(b)
        out.reverse()
        return out

    def forget(self, keep: Iterable[str]) -> None:
        """Drop GPUs not in ``keep`` (removed long ago)."""
        keep = set(keep)
        for uuid in [u for u in self._gpus if u not in keep]:
            del self._gpus[uuid]
