"""What an incremental save reads from the rings: every ring whole at first, then per ring only the points since the
last save (the newest, which could still change, dropped and re-sent), rings gone, a reused pid's ring whole."""

from __future__ import annotations

from gpuwatchd.store import Store
from gpuwatchd.store.journal import Delta, Journal
from tests.rules.conftest import GIB, T0, UUID, gpu, proc, snap, with_processes


def apply(store: Store, t: float, pids: list[int]) -> None:
    store.apply(snap(t, with_processes(gpu(), [proc(p, GIB + int(t - T0) * 1024, rss=GIB) for p in pids])))


def filled(seconds: int, pids: list[int]) -> Store:
    store = Store(retention_seconds=600.0, step_seconds=5.0)
    for s in range(seconds):
        apply(store, T0 + s, pids)  # 1 s polls, as the daemon: the newest point moves within its step
    return store


def proc_entry(delta: Delta, pid: int) -> tuple[int | None, list[float]]:
    (e,) = [e for e in delta.procs if e.key == (UUID, pid)]
    return e.drop, [p.t for p in e.points]


def test_the_first_collect_is_every_ring_whole() -> None:
    store = filled(60, [1, 2])
    delta = Journal().collect(store, full=False)
    drop, ts = proc_entry(delta, 1)
    assert drop is None and ts == [p.t for p in store.process_history(UUID, 1)]
    assert [e.drop for e in delta.gpus] == [None]
    assert [p.t for p in delta.gpus[0].points] == [p.t for p in store.gpu_history(UUID)]
    assert not delta.gone_procs and not delta.gone_gpus


def test_then_only_what_changed_since_the_last_commit() -> None:
    store = filled(60, [1, 2])  # 1 s polls: settled points at 0, 4, ..., 56, the newest at 59
    j = Journal()
    j.commit(j.collect(store, full=False))
    assert j.collect(store, full=False).empty  # nothing moved

    apply(store, T0 + 60, [1, 2])  # within the step of 56: the newest is replaced, the saved one dropped
    delta = j.collect(store, full=False)
    assert proc_entry(delta, 1) == (1, [T0 + 60])
    j.commit(delta)

    apply(store, T0 + 61, [1, 2])  # a step after 56: the saved newest (60) settles, only 61 is new
    delta = j.collect(store, full=False)
    assert proc_entry(delta, 1) == (0, [T0 + 61])
    j.commit(delta)

    for s in range(62, 122):  # a minute of polls; the saved newest (61) was replaced
        apply(store, T0 + s, [1, 2])
    drop, ts = proc_entry(j.collect(store, full=False), 2)
    assert drop == 1 and ts == [p.t for p in store.process_history(UUID, 2) if p.t > T0 + 60]
    assert len(ts) == 16  # the minute's points (4 s apart at 1 s polls, see test_store) and the newest


def test_an_uncommitted_collect_changes_nothing_and_reset_starts_whole() -> None:
    store = filled(30, [1])
    j = Journal()
    j.commit(j.collect(store, full=False))
    apply(store, T0 + 30, [1])
    j.collect(store, full=False)  # its write failed: not committed
    assert proc_entry(j.collect(store, full=False), 1) == (1, [T0 + 30])
    assert proc_entry(j.collect(store, full=True), 1)[0] is None
    j.reset()
    assert proc_entry(j.collect(store, full=False), 1)[0] is None


def test_gone_rings_are_listed_once_and_a_reused_pid_is_whole() -> None:
    store = filled(30, [1, 2])
    j = Journal()
    j.commit(j.collect(store, full=False))
    gone = []
    for s in range(30, 30 + 720):  # pid 2 ends; its ring ages out of the 600 s retention; a save a minute
        apply(store, T0 + s, [1])
        if s % 60 == 0:
            delta = j.collect(store, full=False)
            gone += delta.gone_procs
            assert proc_entry(delta, 1)[0] is not None  # pid 1's anchor is always found
            j.commit(delta)
    assert gone == [(UUID, 2)]

    apply(store, T0 + 750, [1, 2])  # pid 2 again: a new process, its ring starts afresh
    delta = j.collect(store, full=False)
    assert proc_entry(delta, 2) == (None, [T0 + 750]) and not delta.gone_procs


def test_a_ring_recreated_between_two_saves_is_whole() -> None:
    store = filled(30, [1])
    j = Journal()
    j.commit(j.collect(store, full=False))
    store.keep_history([UUID], [])  # dropped (as a restart's prune does) and made again by the next poll
    apply(store, T0 + 30, [1])
    assert proc_entry(j.collect(store, full=False), 1) == (None, [T0 + 30])
