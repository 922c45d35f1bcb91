"""Resolved leak messages say how the leak ended: stopped growing (at what size), process exited, GPU reset."""

from __future__ import annotations

from collections.abc import Callable

from gpuwatchd.model import Alert, Snapshot
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store
from tests.rules.conftest import GIB, MIB, T0, gpu, proc, run, snap, with_processes


def resolved(make: Callable[[float], Snapshot], minutes: float, kind: str = "gpu") -> Alert:
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    engine = RulesEngine(RulesConfig(), host="node1")
    hist = run(store, engine, make, start=T0, end=T0 + minutes * 60, every=30.0)
    fired = [a for _, alerts in hist for a in alerts if a.labels.get("kind") == kind and a.state == "firing"]
    assert fired, "the leak must fire first"
    assert "grows" in fired[-1].summary
    done = [a for a in hist[-1][1] if a.labels.get("kind") == kind and a.state == "resolved"]
    assert len(done) == 1
    return done[0]


def leak_until(stop: float) -> Callable[[float], float]:
    return lambda s: 4 * GIB + 200 * MIB / 60 * min(s, stop)


def test_a_leak_that_levels_off_resolves_as_stopped_growing_at_its_size() -> None:
    grow = leak_until(25 * 60)
    a = resolved(lambda t: snap(t, with_processes(gpu(), [proc(4242, grow(t - T0))])), 40)
    assert "python[4242] stopped growing at 8.9 GiB" in a.summary and "full in" not in a.summary


def test_a_leaking_process_that_exits_resolves_as_exited() -> None:
    grow = leak_until(10**9)

    def make(t: float) -> Snapshot:
        s = t - T0
        return snap(t, with_processes(gpu(), [proc(4242, grow(s))] if s < 25 * 60 else []))

    a = resolved(make, 40)
    assert "pid 4242: process exited, holding 8.9 GiB when last seen" in a.summary
    assert a.labels["process"] == "python"  # the alert keeps its identity; only the text changes


def test_a_leak_ended_by_a_gpu_reset_says_so() -> None:
    grow = leak_until(10**9)

    def make(t: float) -> Snapshot:
        s = t - T0
        if 25 * 60 <= s < 26 * 60:  # reset: the GPU is gone for a minute, comes back empty
            return Snapshot(timestamp=t, nvml_ok=True, gpus=())
        return snap(t, with_processes(gpu(), [proc(4242, grow(s))] if s < 25 * 60 else []))

    assert "pid 4242: GPU reset" in resolved(make, 40).summary


def test_unattributed_growth_that_stops_resolves_as_stopped() -> None:
    def make(t: float) -> Snapshot:
        s = t - T0
        extra = int(300 * MIB + 100 * MIB / 60 * min(s, 25 * 60))
        return snap(t, with_processes(gpu(), [proc(7, 6 * GIB)], overhead=extra))

    a = resolved(make, 40, "unattributed")
    assert "memory not attributed to any process stopped growing at" in a.summary
