"""When a GPU's probe run is due, and whether the GPU may be touched now (decisions only, no I/O).

Per GPU (by UUID), a run is due every ``probes.interval``, and only when the GPU has been idle for the whole of
the last ``probes.idle_for``: no compute process but the probe's own in any poll of that window, and utilization
under ``idle_utilization`` in every poll of it. Both are read from the store's activity log, which keeps every poll
(gpuwatchd/gpu/activity.py), not from the latest snapshot: a job that ended a minute ago with low utilization (a
checkpoint write, CPU-side evaluation, an idle notebook) keeps the GPU busy until ``idle_for`` after it ended. A due
GPU that is busy is skipped (counted, with its reason) and looked at again when it can first have been idle for
``idle_for``: ``idle_for`` after its last busy poll (``MIN_RECHECK_S`` after it for a shorter ``idle_for``). The
duty-cycle cap is enforced here: after a run that took ``d`` seconds, the GPU's next run waits at least
``d / duty_cycle``. Lost, removed and stale GPUs are never candidates.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpuwatchd.probes.config import ProbesConfig
from gpuwatchd.store import Store

# A busy GPU is looked at again after idle_for, but not more often than this (keeps the skip counter readable).
MIN_RECHECK_S = 30.0


@dataclass(slots=True)
class GpuSchedule:
    next_due: float
    last_start: float | None = None
    last_duration: float = 0.0


def foreign_process(store: Store, uuid: str, own: Collection[int]) -> int | None:
    """The pid of a compute process on the GPU that is not ours (None when there is none)."""
    g = store.gpu(uuid)
    if g is None:
        return None
    for p in g.processes:
        if p.kind == "compute" and p.pid not in own:
            return p.pid
    return None


def present(store: Store, uuid: str) -> bool:
    pres = store.presence.get(uuid)
    return store.gpu(uuid) is not None and (pres is None or pres.state == "present") and not store.stale


class Scheduler:
    def __init__(self, cfg: ProbesConfig) -> None:
        self.cfg = cfg
        self.gpus: dict[str, GpuSchedule] = {}

    def decide(self, store: Store, now: float, own: Collection[int]) -> tuple[list[str], list[tuple[str, str]]]:
        """(GPUs to run now, most overdue first; (uuid, reason) skips to count)."""
        cfg = self.cfg
        due: list[tuple[float, str]] = []
        skips: list[tuple[str, str]] = []
        snap = store.latest
        if snap is None or not cfg.enabled:
            return [], []
        own = set(own)
        for g in snap.gpus:
            if not present(store, g.uuid) or g.parent_uuid is not None:  # MIG devices: not probed
                continue
            s = self.gpus.get(g.uuid)
            if s is None:
                s = self.gpus[g.uuid] = GpuSchedule(next_due=now)
            if now < s.next_due:
                continue
            if s.last_start is not None:
                earliest = s.last_start + s.last_duration / cfg.duty_cycle
                if now < earliest:
                    s.next_due = earliest
                    skips.append((g.uuid, "duty_cycle"))
                    continue
            start = now - cfg.idle_for
            first = store.activity.first_seen(g.uuid)
            if first is None or first > start + store.step_seconds:
                continue  # not watched for idle_for yet (just started or just appeared): wait, not a skip
            window = store.activity.since(g.uuid, start)
            busy_pids = [b for b in window if b.end > start and b.pids - own]
            if busy_pids or foreign_process(store, g.uuid, own) is not None:
                last = busy_pids[-1].end if busy_pids else now
                s.next_due = last + max(cfg.idle_for, MIN_RECHECK_S)
                skips.append((g.uuid, "busy_process"))
                continue
            busy_util = [b for b in window if b.end > start and (b.max_util or 0.0) >= cfg.idle_utilization]
            if busy_util or (g.utilization_gpu_ratio or 0.0) >= cfg.idle_utilization:
                last = busy_util[-1].end if busy_util else now
                s.next_due = last + max(cfg.idle_for, MIN_RECHECK_S)
                skips.append((g.uuid, "busy_utilization"))
                continue
            due.append((s.next_due, g.uuid))
        return [u for _, u in sorted(due)], skips

    def started(self, uuid: str, now: float) -> None:
        s = self.gpus.setdefault(uuid, GpuSchedule(next_due=now))
        s.last_start = now
        s.next_due = now + self.cfg.interval

    def finished(self, uuid: str, now: float) -> None:
        s = self.gpus.get(uuid)
        if s is not None and s.last_start is not None:
            s.last_duration = max(0.0, now - s.last_start)

    def postpone(self, uuid: str, now: float) -> None:
        """A run that could not start or was cancelled: look again after idle_for."""
        s = self.gpus.setdefault(uuid, GpuSchedule(next_due=now))
        s.next_due = now + max(self.cfg.idle_for, MIN_RECHECK_S)
