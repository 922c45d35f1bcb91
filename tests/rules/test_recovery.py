"""``GpuRecoveryActionRequired``: the driver's recovery action, with DCGM's DRIVER health severities."""

from __future__ import annotations

import pytest

from gpuwatchd.gpu.recovery_action import ACTIONS
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, gpu, snap


@pytest.mark.parametrize(("value", "severity", "words"), [
    (1, "critical", "asks for a GPU reset"),
    (2, "critical", "asks for a node reboot"),
    (3, "warning", "asks for a drain of peer-to-peer traffic"),
    (4, "critical", "asks for a drain and a GPU reset"),
    (9, "critical", "asks for recovery action 9 (unknown to this gpuwatchd)"),
])
def test_an_action_fires_at_once_saying_which(value: int, severity: str, words: str) -> None:
    store = Store()
    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, gpu(index=2, recovery_action=value)))
    (a,) = [a for a in eng.evaluate(store, T0) if a.name == "GpuRecoveryActionRequired"]
    assert (a.state, a.severity, a.labels["gpu"]) == ("firing", severity, "2")
    assert words in a.summary and a.labels["action"] == (ACTIONS[value].label if value in ACTIONS else "unknown_9")
    if value in (1, 4):
        assert "nvidia-smi -r -i 2" in a.annotations["action"]
    store.apply(snap(T0 + 5, gpu(index=2, recovery_action=0)))
    (r,) = [a for a in eng.evaluate(store, T0 + 5) if a.name == "GpuRecoveryActionRequired"]
    assert (r.state, r.summary) == ("resolved", "GPU 2 (NVIDIA A10G): the driver asks for no recovery action any more")


def test_none_and_unknown_to_the_driver_are_quiet() -> None:
    store = Store()
    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, gpu(recovery_action=0), gpu(uuid="GPU-x", index=1)))
    assert eng.evaluate(store, T0) == []


def test_action_numbers_are_nvml_h() -> None:
    import pynvml as N  # the test checks the table against the real binding's constants

    for value, a in ACTIONS.items():
        assert getattr(N, f"NVML_GPU_RECOVERY_ACTION_{a.label.upper()}") == value
