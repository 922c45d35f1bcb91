"""Idle means idle for the whole ``idle_for``: no compute process and low utilization in every poll of the window,
read from the store's full-resolution activity log (not the latest snapshot, not the thinned history)."""

from __future__ import annotations

from gpuwatchd.model import Snapshot
from gpuwatchd.probes.config import ProbesConfig
from gpuwatchd.probes.scheduler import Scheduler
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.store import Store

from .helpers import T0, UUID, gpu


def _poll(store: Store, clock: ManualClock, seconds: float, every: float = 1.0, **kw: object) -> None:
    """One snapshot every ``every`` s for ``seconds`` (the daemon polls every second; history keeps one per 5 s)."""
    end = clock.now() + seconds
    while clock.now() < end:
        store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(gpu(**kw),)))  # type: ignore[arg-type]
        clock.advance(every)


def _setup() -> tuple[Scheduler, Store, ManualClock]:
    return Scheduler(ProbesConfig(interval=3600, idle_for=300, duty_cycle=1.0)), Store(), ManualClock(T0)


def test_a_job_that_ended_with_low_utilization_keeps_the_gpu_busy_for_idle_for() -> None:
    sched, store, clock = _setup()
    _poll(store, clock, 600, pids=(4242,), util=0.0)  # a job writing a checkpoint: a process, no utilization
    ended = clock.now()
    _poll(store, clock, 60)  # gone for a minute: the latest snapshot is idle, the window is not
    assert sched.decide(store, clock.now(), ()) == ([], [(UUID, "busy_process")])
    # Looked at again when it can first have been idle for idle_for, not at every tick:
    assert sched.gpus[UUID].next_due >= ended - 1.0 + 300
    _poll(store, clock, sched.gpus[UUID].next_due - clock.now())
    assert clock.now() >= ended - 1.0 + 300  # idle_for after the last poll that listed the job
    assert sched.decide(store, clock.now(), ())[0] == [UUID]


def test_a_process_seen_in_one_poll_between_history_points_counts() -> None:
    sched, store, clock = _setup()
    _poll(store, clock, 400)
    clock.advance(0.5)  # a poll that the 5 s history would overwrite with the next one
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(gpu(pids=(777,)),)))
    clock.advance(0.5)
    _poll(store, clock, 10)
    assert sched.decide(store, clock.now(), ()) == ([], [(UUID, "busy_process")])


def test_one_busy_poll_of_utilization_counts() -> None:
    sched, store, clock = _setup()
    _poll(store, clock, 400)
    _poll(store, clock, 1, util=0.9)
    _poll(store, clock, 10)
    assert sched.decide(store, clock.now(), ()) == ([], [(UUID, "busy_utilization")])


def test_the_probes_own_past_workers_do_not_make_the_gpu_busy() -> None:
    sched, store, clock = _setup()
    _poll(store, clock, 400)
    _poll(store, clock, 10, pids=(999,))  # the probe worker's CUDA context, seen by NVML
    _poll(store, clock, 10)
    assert sched.decide(store, clock.now(), {999}) == ([UUID], [])
    assert sched.decide(store, clock.now(), ())[1] == [(UUID, "busy_process")]


def test_a_gpu_not_watched_for_idle_for_waits_without_a_skip() -> None:
    sched, store, clock = _setup()
    _poll(store, clock, 100)
    assert sched.decide(store, clock.now(), ()) == ([], [])
