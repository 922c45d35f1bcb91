"""Flat series skipped from a memo (rules/leak/flat.py) give exactly the conditions a whole read of every history
gives: compared evaluation by evaluation on a store whose processes stay flat, leak, level off, lose a reading,
leave and come back, with host RSS judged and not."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.model import Snapshot
from gpuwatchd.rules import leak
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.leak.flat import FlatSeries
from gpuwatchd.store import Store
from tests.rules.conftest import GIB, MIB, T0, gpu, proc, snap, with_processes


class WholeReads:
    """The store without ``process_history_after``: the leak family then reads every history whole."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "process_history_after":
            raise AttributeError(name)
        return getattr(self._store, name)


def _fleet(t: float) -> Snapshot:
    k = (t - T0) / 60.0  # minutes
    procs = [
        proc(100, 2 * GIB, rss=1 * GIB),  # flat throughout
        proc(101, 1 * GIB + (min(k, 12.0) * 200 * MIB), rss=1 * GIB),  # leaks 12 min, then holds
        proc(102, 3 * GIB, rss=1 * GIB + int(k) * 64 * MIB),  # GPU flat, host RSS grows a step a minute
    ]
    if not 8.0 <= k < 9.0:  # leaves for a minute and comes back (a new ring)
        procs.append(proc(103, 512 * MIB + (64 * MIB if k >= 20.0 else 0), rss=256 * MIB))
    if k < 15.0 or k >= 16.0:
        procs.append(proc(104, 768 * MIB))  # no host RSS reading
    return snap(t, with_processes(gpu(), procs))


@pytest.mark.parametrize("host_rss", [True, False])
def test_skipping_flat_series_changes_no_condition(host_rss: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leak, "_FLAT", FlatSeries())
    config = validate(RulesConfig, {"leak": {"host_rss": host_rss, "window": "10m"}})
    store = Store()
    skipped = 0
    judged: set[tuple[str, str]] = set()
    t = T0
    while t <= T0 + 40 * 60:
        store.apply(_fleet(t))
        if round(t - T0) % 15 == 0:
            memo = leak.conditions(store, t, config)
            kept = leak._FLAT
            skipped += len(kept._memo)
            leak._FLAT = FlatSeries()  # the whole read on a memo of its own, which it leaves empty
            whole = leak.conditions(WholeReads(store), t, config)  # type: ignore[arg-type]
            leak._FLAT = kept
            assert memo == whole, t - T0
            judged |= {(c.labels["pid"], c.labels["kind"]) for c in memo if "pid" in c.labels}
        t += 5.0
    assert skipped > 0
    # the leaking process and the growing host RSS were judged, the flat ones skipped
    assert ("101", "gpu") in judged and (("102", "host_rss") in judged) == host_rss


def test_a_series_read_from_the_memo_turns_flat_and_back() -> None:
    flat = FlatSeries()
    store = Store()
    for i in range(10):
        store.apply(snap(T0 + 5 * i, with_processes(gpu(), [proc(7, 1 * GIB, rss=1 * GIB)])))
    assert flat.flat(store, gpu().uuid, 7, True)
    flat.done()
    store.apply(snap(T0 + 50, with_processes(gpu(), [proc(7, 2 * GIB, rss=1 * GIB)])))
    assert not flat.flat(store, gpu().uuid, 7, True)  # the newest point (not settled yet) counts ...
    flat.done()
    assert flat._memo  # ... but is not kept: the settled ones are still one value
    store.apply(snap(T0 + 55, with_processes(gpu(), [proc(7, 2 * GIB, rss=1 * GIB)])))
    assert not flat.flat(store, gpu().uuid, 7, False)
    flat.done()
    assert not flat._memo  # two values settled: forgotten, read whole next time
    assert flat.flat(store, "GPU-no-such", 7, True)  # no history: nothing to judge
    assert not flat.flat(object(), gpu().uuid, 7, True)  # a view that cannot say: unsure


class CountingReads:
    """The store, counting the points ``process_history_after`` hands out (what the flat memo reads)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.points: dict[tuple[str, int], int] = {}

    def process_history_after(self, uuid: str, pid: int, anchor: object) -> Any:
        points, found, mutable = self._store.process_history_after(uuid, pid, anchor)
        self.points[(uuid, pid)] = self.points.get((uuid, pid), 0) + len(points)
        return points, found, mutable

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("host_rss", [True, False])
def test_a_primed_memo_after_a_restore_reads_only_what_came_since(host_rss: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon primes the memo after restoring the rule history (rules.leak.prime): the first evaluation after a
    restart then reads the points since, not every series whole, and says what a whole read says."""
    config = validate(RulesConfig, {"leak": {"host_rss": host_rss, "window": "10m"}})
    before = Store()
    t = T0
    while t <= T0 + 30 * 60:  # half an hour of history, as a save would have kept it
        before.apply(_fleet(t))
        t += 5.0
    saved_procs = {k: before.process_history(*k) for k in before.process_keys()}
    saved_gpus = {u: before.gpu_history(u) for u in before.gpu_keys()}

    after = Store()  # the restarted daemon: the history restored, then its first polls
    after.restore_history(saved_gpus, saved_procs)
    monkeypatch.setattr(leak, "_FLAT", FlatSeries())
    assert leak.prime(after, host_rss) == len(saved_procs)
    for i in range(1, 4):
        after.apply(_fleet(t + 5.0 * i))
    now = t + 15.0
    reads = CountingReads(after)
    first = leak.conditions(reads, now, config)  # type: ignore[arg-type]
    flat_series = set(leak._FLAT._memo)
    assert len(flat_series) >= 2  # the flat processes were answered from the memo ...
    assert all(reads.points[k] <= 4 for k in flat_series)  # ... from the points since the restore, not 360 each
    monkeypatch.setattr(leak, "_FLAT", FlatSeries())
    whole = leak.conditions(WholeReads(after), now, config)  # type: ignore[arg-type]
    assert first == whole
    cold = CountingReads(after)
    monkeypatch.setattr(leak, "_FLAT", FlatSeries())
    leak.conditions(cold, now, config)  # type: ignore[arg-type]
    assert all(cold.points[k] > 300 for k in flat_series)  # without the prime: every flat series read whole
