"""``GpuFabricNotReady``: a fabric GPU not registered (not started, in progress, failed) fires after its ``for``
and resolves once registered; a GPU without a fabric never alerts."""

from __future__ import annotations

import pytest

from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, gpu, snap


@pytest.mark.parametrize(("state", "status", "words"), [
    (1, 0, "has not started registering"),
    (2, 0, "is still registering"),
    (3, 999, "failed to register with the NVLink fabric (NVML status 999)"),
])
def test_not_registered_fires_after_for_and_resolves(state: int, status: int, words: str) -> None:
    store = Store()
    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, gpu(index=3, fabric_state=state, fabric_status=status)))
    (a,) = [a for a in eng.evaluate(store, T0) if a.name == "GpuFabricNotReady"]
    assert (a.state, a.severity, a.labels["gpu"]) == ("pending", "critical", "3")
    store.apply(snap(T0 + 121, gpu(index=3, fabric_state=state, fabric_status=status)))
    (a,) = [a for a in eng.evaluate(store, T0 + 121) if a.name == "GpuFabricNotReady"]
    assert a.state == "firing" and words in a.summary
    assert "systemctl status nvidia-fabricmanager" in a.description and "-i 3" in a.description
    store.apply(snap(T0 + 130, gpu(index=3, fabric_state=3, fabric_status=0)))
    (r,) = [a for a in eng.evaluate(store, T0 + 130) if a.name == "GpuFabricNotReady"]
    assert r.state == "resolved" and "registered with the NVLink fabric" in r.summary


def test_completed_and_no_fabric_are_quiet() -> None:
    store = Store()
    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, gpu(fabric_state=3, fabric_status=0), gpu(uuid="GPU-x", index=1)))
    assert eng.evaluate(store, T0) == []
    assert eng.evaluate(store, T0 + 500) == []
