"""The activity log folds every poll into step-wide buckets (max utilization, union of compute pids) and keeps
retention's worth of them."""

from __future__ import annotations

from gpuwatchd.gpu.activity import ActivityLog


def test_polls_fold_into_buckets_without_losing_any() -> None:
    log = ActivityLog(step=5.0, retention=60.0)
    for t, util, pids in [(0, 0.0, ()), (1, 0.9, ()), (2, 0.0, (7,)), (3, 0.0, ()), (5, 0.1, ()), (6, None, (8,))]:
        log.add("g", float(t), util, pids)
    b0, b1 = log.since("g", 0.0)
    assert (b0.start, b0.end, b0.max_util, b0.pids) == (0.0, 3.0, 0.9, {7})
    assert (b1.start, b1.end, b1.max_util, b1.pids) == (5.0, 6.0, 0.1, {8})
    assert [b.start for b in log.since("g", 4.0)] == [5.0]
    assert log.first_seen("g") == 0.0 and log.first_seen("other") is None


def test_bounded_by_retention_and_forgets_gpus() -> None:
    log = ActivityLog(step=5.0, retention=60.0)
    for t in range(1000):
        log.add("g", float(t), 0.0, ())
    assert len(log.since("g", 0.0)) <= 60 / 5 + 1
    assert log.first_seen("g") is not None and log.first_seen("g") >= 999 - 60 - 5
    log.forget([])
    assert log.first_seen("g") is None
