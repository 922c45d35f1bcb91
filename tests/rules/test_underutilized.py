"""GpuUnderutilized (rules/underutilized.py): off by default; memory held while the SMs idle for ``for``; names the
process; a busy GPU or released memory never fires; bursts below the clear threshold neither reset nor flap it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, GpuSample
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import GIB, T0, UUID, gpu, proc, run, snap, with_processes

ON = {"underutilized": {"enabled": True}}


def engine(**cfg: object) -> RulesEngine:
    return RulesEngine(validate(RulesConfig, cfg), host="node1")


def held(util: float, **kw: object) -> GpuSample:
    # 14 GiB of 24 GiB held by pid 4242 (python, alice), a second small process
    g = with_processes(gpu(**kw), [proc(4242, 14 * GIB), proc(77, 1 * GIB, name="nvtop")])
    return replace(g, utilization_gpu_ratio=util)


def fired(hist: list[tuple[float, list[Alert]]]) -> list[tuple[float, Alert]]:
    return [(t, a) for t, al in hist for a in al if a.name == "GpuUnderutilized" and a.state == "firing"]


def test_off_by_default(store: Store) -> None:
    hist = run(store, engine(), lambda t: snap(t, held(0.01)), start=T0, end=T0 + 3600, every=60)
    assert [a for _, al in hist for a in al if a.name == "GpuUnderutilized"] == []


def test_idle_gpu_holding_memory_fires_after_for_and_names_the_holder(store: Store) -> None:
    hist = run(store, engine(**ON), lambda t: snap(t, held(0.02)), start=T0, end=T0 + 2400, every=60)
    t, a = fired(hist)[0]
    assert T0 + 1800 <= t <= T0 + 1860  # the rule's for: 30 min
    assert a.severity == "info"
    assert (a.labels["uuid"], a.labels["pid"], a.labels["process"]) == (UUID, "4242", "python")
    assert a.summary == ("GPU 0 (NVIDIA A10G): 15.3 GiB of 24.0 GiB held (64%) but GPU utilization is 2%; the "
                         "memory is held by python (pid 4242, user alice)")


@pytest.mark.parametrize("util", [0.6, 0.2])
def test_busy_gpu_does_not_fire(store: Store, util: float) -> None:
    hist = run(store, engine(**ON), lambda t: snap(t, held(util)), start=T0, end=T0 + 3600, every=60)
    assert [a for _, al in hist for a in al if a.name == "GpuUnderutilized"] == []


def test_idle_gpu_without_memory_held_does_not_fire(store: Store) -> None:
    idle = replace(gpu(), utilization_gpu_ratio=0.0)  # 1 GiB of 24 GiB: an idle, free GPU
    hist = run(store, engine(**ON), lambda t: snap(t, idle), start=T0, end=T0 + 3600, every=60)
    assert [a for _, al in hist for a in al if a.name == "GpuUnderutilized"] == []


def test_bursts_below_the_clear_threshold_do_not_reset_and_busy_resolves(store: Store) -> None:
    def make(t: float):  # type: ignore[no-untyped-def]
        s = t - T0
        util = 0.9 if s >= 2400 else (0.12 if int(s / 60) % 4 == 0 else 0.01)  # a burst to 12% every 4th minute
        return snap(t, held(util))

    hist = run(store, engine(**ON), make, start=T0, end=T0 + 2700, every=60)
    t, _ = fired(hist)[0]
    assert t <= T0 + 1860  # the bursts kept it pending
    last = [a for a in hist[-1][1] if a.name == "GpuUnderutilized"]
    assert [a.state for a in last] == ["resolved"]
    assert last[0].summary == "GPU 0 (NVIDIA A10G): busy again, GPU utilization 90%"


def test_gpm_sm_activity_is_preferred(store: Store) -> None:
    # utilization.gpu counts any kernel running (a tiny kernel keeps it high); GPM says how many SM cycles worked
    from gpuwatchd.rules.underutilized import activity

    g = held(0.8)
    assert activity(g) == (0.8, "GPU utilization")
    assert activity(replace(g, gpm_sm_activity_ratio=0.03)) == (0.03, "SM activity")


def test_clear_threshold_must_not_be_below_raise() -> None:
    with pytest.raises(ValueError, match="clear_activity_ratio"):
        validate(RulesConfig, {"underutilized": {"max_activity_ratio": 0.2, "clear_activity_ratio": 0.1}})
