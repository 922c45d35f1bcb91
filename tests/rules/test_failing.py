"""GpuwatchdRuleFailing: a family raising at every evaluation becomes an alert, through the engine's state machine."""

from __future__ import annotations

import logging

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import FAMILIES, FamilySpec, RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, gpu, snap


def _engine(broken_until: list[float], config: RulesConfig | None = None) -> RulesEngine:
    def throttle(view: RuleView, now: float, cfg: RulesConfig) -> list[Condition]:
        if now < broken_until[0]:
            raise ValueError("math domain error")
        return []

    fams = tuple(
        FamilySpec("throttle", throttle, {"GpuThrottled": lambda c: c.throttle}) if f.name == "throttle" else f
        for f in FAMILIES
    )
    return RulesEngine(config or RulesConfig(), host="node1", families=fams)


def test_a_family_failing_for_five_minutes_fires_and_resolves_when_it_runs_again(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatchd.rules.engine")
    until = [T0 + 600]
    eng = _engine(until)
    store.apply(snap(T0, gpu()))
    states = {}
    for k in range(0, 700, 30):
        alerts = [a for a in eng.evaluate(store, T0 + k) if a.name == "GpuwatchdRuleFailing"]
        states[k] = alerts[0].state if alerts else None
    assert states[0] == "pending" and states[270] == "pending"
    assert states[300] == "firing" and states[570] == "firing"
    assert states[600] == "resolved"
    (alert,) = [a for a in eng.alerts() if a.name == "GpuwatchdRuleFailing"]
    assert alert.labels == {"alertname": "GpuwatchdRuleFailing", "severity": "warning", "host": "node1",
                            "family": "throttle"}
    assert "throttle" in alert.summary and "ValueError: math domain error" in alert.summary
    assert "GpuThrottled cannot fire" in alert.description
    # one traceback per streak of failures, not one per evaluation (20 failing evaluations above)
    assert caplog.text.count("rule family throttle failed") == 1
    assert "rule family throttle evaluates again" in caplog.text
    assert eng.stats["throttle"].failures == 20


def test_it_can_be_turned_off(store: Store) -> None:
    eng = _engine([T0 + 600], validate(RulesConfig, {"rule_failing": {"enabled": False}}))
    store.apply(snap(T0, gpu()))
    assert not [a for a in eng.evaluate(store, T0) if a.name == "GpuwatchdRuleFailing"]
