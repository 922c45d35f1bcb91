"""The alert state machine: pending -> firing after for:, keep_firing_for, hysteresis levels, resolved retention,
identity by fingerprint, failure isolation, reconfigure, and the ALERTS-like collector."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.rules.condition import Condition, Level, RuleView
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import FAMILIES, FamilySpec, RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector
from gpuwatchd.store import Store

from .conftest import T0, UUID, gpu, snap


class Switch:
    """A rule family whose condition a test sets by hand (the engine is what is under test here)."""

    def __init__(self) -> None:
        self.level: Level | None = None
        self.value = 1.0
        self.calls = 0
        self.index = "0"

    def __call__(self, view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
        self.calls += 1
        if self.level is None:
            return []
        return [
            Condition(
                "GpuTemperatureHigh", "warning", {"uuid": UUID, "gpu": self.index, "model": "NVIDIA A10G"},
                f"hot {self.value}", "cool it", value=self.value, level=self.level,
            )
        ]


def make(cfg: dict[str, object] | None = None) -> tuple[RulesEngine, Switch]:
    sw = Switch()
    fam = FamilySpec("switch", sw, {"GpuTemperatureHigh": lambda c: c.temperature})
    return RulesEngine(validate(RulesConfig, cfg or {}), host="node1", families=(fam,)), sw


def only(alerts: list[Alert]) -> Alert:
    assert len(alerts) == 1, alerts
    return alerts[0]


def test_pending_then_firing_after_for_with_active_at_kept() -> None:
    eng, sw = make({"temperature": {"for": "60s"}})
    store = Store()
    sw.level = "raise"
    a0 = only(eng.evaluate(store, T0))
    assert a0.state == "pending" and a0.active_at == T0 and a0.fired_at is None
    a1 = only(eng.evaluate(store, T0 + 30))
    assert a1.state == "pending" and a1.active_at == T0
    sw.value = 2.0
    a2 = only(eng.evaluate(store, T0 + 60))
    assert a2.state == "firing" and a2.active_at == T0 and a2.fired_at == T0 + 60
    assert a2.summary == "hot 2.0" and a2.value == 2.0  # content follows the condition, identity does not change
    assert a2.fingerprint == a0.fingerprint
    assert a2.labels == {
        "alertname": "GpuTemperatureHigh", "severity": "warning", "host": "node1",
        "uuid": UUID, "gpu": "0", "model": "NVIDIA A10G",
    }


def test_pending_that_clears_vanishes_silently() -> None:
    eng, sw = make({"temperature": {"for": "60s"}})
    sw.level = "raise"
    eng.evaluate(Store(), T0)
    sw.level = None
    assert eng.evaluate(Store(), T0 + 30) == []
    sw.level = "raise"
    assert only(eng.evaluate(Store(), T0 + 40)).active_at == T0 + 40  # a new episode, a new active_at


def test_resolved_is_kept_for_retention_then_dropped() -> None:
    eng, sw = make({"temperature": {"for": 0}, "resolved_retention": "15m"})
    sw.level = "raise"
    fired = only(eng.evaluate(Store(), T0))
    assert fired.state == "firing"  # for: 0 fires at once
    sw.level = None
    r = only(eng.evaluate(Store(), T0 + 10))
    assert r.state == "resolved" and r.resolved_at == T0 + 10 and r.fired_at == T0
    assert only(eng.evaluate(Store(), T0 + 10 + 900)).state == "resolved"
    assert eng.evaluate(Store(), T0 + 10 + 901) == []


def test_condition_back_after_resolution_is_a_new_alert() -> None:
    eng, sw = make({"temperature": {"for": 0}})
    sw.level = "raise"
    eng.evaluate(Store(), T0)
    sw.level = None
    eng.evaluate(Store(), T0 + 10)
    sw.level = "raise"
    a = only(eng.evaluate(Store(), T0 + 20))
    assert a.state == "firing" and a.active_at == T0 + 20 and a.resolved_at is None


def test_keep_firing_for_bridges_flapping() -> None:
    eng, sw = make({"temperature": {"for": 0, "keep_firing_for": "2m"}})
    sw.level = "raise"
    eng.evaluate(Store(), T0)
    states = []
    for i, lvl in enumerate([None, "raise", None, None, None, None, None]):
        sw.level = lvl  # type: ignore[assignment]
        states.append(only(eng.evaluate(Store(), T0 + 30 * (i + 1))).state)
    # gaps shorter than 2 min keep it firing; 2 min after the last hold it resolves
    assert states == ["firing", "firing", "firing", "firing", "firing", "resolved", "resolved"]


def test_hold_level_continues_but_never_starts() -> None:
    eng, sw = make({"temperature": {"for": "60s"}})
    sw.level = "hold"
    assert eng.evaluate(Store(), T0) == []
    sw.level = "raise"
    eng.evaluate(Store(), T0 + 10)
    sw.level = "hold"
    assert only(eng.evaluate(Store(), T0 + 70)).state == "firing"  # held -> the for: hold elapses
    sw.level = None
    assert only(eng.evaluate(Store(), T0 + 80)).state == "resolved"


def test_temperature_hysteresis_through_a_real_family(store: Store) -> None:
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": 0}}), host="node1")
    # slowdown 95 °C: raise at >= 90 (margin 5), hold above 87 (clear margin 8)
    seq = [(80.0, None), (91.0, "firing"), (88.0, "firing"), (90.5, "firing"), (86.5, "resolved"),
           (89.0, "resolved"), (90.0, "firing")]
    for i, (temp, want) in enumerate(seq):
        t = T0 + 5 * i
        store.apply(snap(t, gpu(temperature_celsius=temp)))
        alerts = [a for a in eng.evaluate(store, t) if a.name == "GpuTemperatureHigh"]
        assert (alerts[0].state if alerts else None) == want, (temp, alerts)


def test_failing_family_is_counted_and_others_still_run(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def broken(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise ZeroDivisionError("boom")
        return [Condition("GpuThrottled", "warning", {"uuid": UUID}, "s", "d")]

    fams = (FamilySpec("throttle", broken, {"GpuThrottled": lambda c: c.throttle}), *FAMILIES[1:])
    eng = RulesEngine(validate(RulesConfig, {"throttle": {"for": 0}}), host="h", families=fams)
    store.apply(snap(T0, gpu(temperature_celsius=93.0)))
    eng.evaluate(store, T0)
    alerts = eng.evaluate(store, T0 + 120)
    names = {a.name: a.state for a in alerts}
    # the throttle alert keeps its state (missing data is not "all clear"); temperature still evaluated
    # ... and the failure itself is an alert (pending for rules.rule_failing.for, 5 min)
    assert names == {"GpuThrottled": "firing", "GpuTemperatureHigh": "firing", "GpuwatchdRuleFailing": "pending"}
    assert eng.stats["throttle"].failures == 1 and "ZeroDivisionError: boom" in (eng.stats["throttle"].last_error or "")
    assert "rule family throttle failed" in caplog.text

    reg = CollectorRegistry()
    reg.register(AlertsCollector(eng))
    text = generate_latest(reg).decode()
    assert 'gpuwatchd_rule_evaluation_failures_total{family="throttle"} 1.0' in text
    assert 'gpuwatchd_rule_evaluation_failures_total{family="temperature"} 0.0' in text
    assert "gpuwatchd_rule_evaluation_duration_seconds{family=\"temperature\"}" in text


def test_reconfigure_disabling_a_rule_resolves_its_alerts(store: Store) -> None:
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": 0}}), host="h")
    store.apply(snap(T0, gpu(temperature_celsius=93.0)))
    assert only(eng.evaluate(store, T0)).state == "firing"
    eng.reconfigure(validate(RulesConfig, {"temperature": {"enabled": False}}))
    assert only(eng.evaluate(store, T0 + 5)).state == "resolved"


def test_alerts_collector_exports_pending_and_firing_only(store: Store) -> None:
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": "1m"}}), host="node1")
    store.apply(snap(T0, gpu(temperature_celsius=93.0), gpu(uuid="GPU-b", index=1, temperature_celsius=93.0)))
    eng.evaluate(store, T0)
    store.apply(snap(T0 + 60, gpu(temperature_celsius=93.0), gpu(uuid="GPU-b", index=1, temperature_celsius=93.0)))
    eng.evaluate(store, T0 + 60)
    store.apply(snap(T0 + 65, gpu(temperature_celsius=50.0), gpu(uuid="GPU-b", index=1, temperature_celsius=50.0)))
    eng.evaluate(store, T0 + 65)  # both resolved now
    store.apply(snap(T0 + 70, gpu(temperature_celsius=93.0), gpu(uuid="GPU-b", index=1, temperature_celsius=50.0)))
    eng.evaluate(store, T0 + 70)
    reg = CollectorRegistry()
    reg.register(AlertsCollector(eng))
    lines = [x for x in generate_latest(reg).decode().splitlines() if x.startswith("gpuwatchd_alerts{")]
    assert len(lines) == 1  # GPU 0 pending again; the resolved ones are not series
    assert 'alertstate="pending"' in lines[0] and 'alertname="GpuTemperatureHigh"' in lines[0]
    assert f'uuid="{UUID}"' in lines[0] and 'host="node1"' in lines[0] and lines[0].endswith(" 1.0")


def test_alerts_series_are_rebuilt_only_when_an_alert_comes_goes_or_changes_state(store: Store) -> None:
    # With 4,096 alerts (16 x 256, every process gone) building gpuwatchd_alerts on every render held the event
    # loop for tens of ms; it is rebuilt when the engine's ``changes`` moves, and shows the same series as fresh.
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": "1m"}}), host="node1")
    collector = AlertsCollector(eng)

    def family() -> Metric:
        return next(m for m in collector.collect() if m.name == "gpuwatchd_alerts")

    def states() -> list[str]:
        return [s.labels["alertstate"] for s in family().samples]

    store.apply(snap(T0, gpu(temperature_celsius=93.0)))
    eng.evaluate(store, T0)
    first = family()
    assert states() == ["pending"]
    store.apply(snap(T0 + 5, gpu(temperature_celsius=94.0)))  # new words and value, same state
    eng.evaluate(store, T0 + 5)
    assert family() is first
    store.apply(snap(T0 + 60, gpu(temperature_celsius=94.0)))
    eng.evaluate(store, T0 + 60)
    assert family() is not first and states() == ["firing"]
    store.apply(snap(T0 + 65, gpu(temperature_celsius=50.0)))
    eng.evaluate(store, T0 + 65)
    assert states() == []


def test_two_gpus_are_two_identities(store: Store) -> None:
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": 0}}), host="h")
    g0 = gpu(temperature_celsius=93.0)
    store.apply(snap(T0, g0, replace(g0, uuid="GPU-b", index=1)))
    alerts = eng.evaluate(store, T0)
    assert len({a.fingerprint for a in alerts}) == 2
    assert sorted(a.labels["gpu"] for a in alerts) == ["0", "1"]


def test_family_interval_reuses_last_conditions() -> None:
    sw = Switch()
    fam = FamilySpec("switch", sw, {"GpuTemperatureHigh": lambda c: c.temperature}, lambda c: 60.0)
    eng = RulesEngine(validate(RulesConfig, {"temperature": {"for": "30s"}}), host="h", families=(fam,))
    sw.level = "raise"
    assert only(eng.evaluate(Store(), T0)).state == "pending"
    sw.level = None  # not looked at until the interval has passed: the last result stands
    assert only(eng.evaluate(Store(), T0 + 30)).state == "firing" and sw.calls == 1
    assert only(eng.evaluate(Store(), T0 + 60)).state == "resolved" and sw.calls == 2
    eng.reconfigure(eng.config)  # a reload re-runs every family at once
    eng.evaluate(Store(), T0 + 61)
    assert sw.calls == 3


def test_alerts_exposition_passes_promtool(store: Store) -> None:
    import shutil
    import subprocess

    from gpuwatchd.model import XidEvent

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, gpu(temperature_celsius=93.0, ecc_uncorrected_volatile=1),
                     xid_events=(XidEvent(UUID, 79, T0),)))
    eng.evaluate(store, T0)
    reg = CollectorRegistry()
    reg.register(AlertsCollector(eng))
    text = generate_latest(reg)
    # three alerts with different label sets (xid, kind) in one family
    assert text.count(b"gpuwatchd_alerts{") == 3
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu_at_a_new_index_keeps_its_ongoing_alert() -> None:
    # An eGPU replugged at another index is the same GPU (same UUID): its firing alert must not turn into a second
    # alert (which the dispatcher would announce again); it keeps the labels it was announced with.
    eng, sw = make({"temperature": {"for": "0s"}})
    store = Store()
    sw.level = "raise"
    a0 = only(eng.evaluate(store, T0))
    assert a0.state == "firing" and a0.labels["gpu"] == "0"
    sw.index = "1"
    sw.value = 2.0
    a1 = only(eng.evaluate(store, T0 + 10))
    assert a1.fingerprint == a0.fingerprint and a1.labels["gpu"] == "0"
    assert a1.state == "firing" and a1.active_at == T0 and a1.summary == "hot 2.0"
    # Once it has resolved, a new episode at the new index is a new alert with the new label.
    sw.level = None
    assert only(eng.evaluate(store, T0 + 20)).state == "resolved"
    sw.level = "raise"
    alerts = eng.evaluate(store, T0 + 30)
    fresh = [a for a in alerts if a.state == "firing"]
    assert len(fresh) == 1 and fresh[0].labels["gpu"] == "1" and fresh[0].active_at == T0 + 30


class Verdicts:
    """A family whose one GpuMemoryLeak condition a test sets level, hold, evidence and fire_on_hold of (the
    leak rule's shape: a loose ``hold`` keeps a pending alert but cannot fire it)."""

    def __init__(self) -> None:
        self.level: Level | None = None
        self.hold_for: float | None = None
        self.evidence: str | None = None
        self.fire_on_hold = False

    def __call__(self, view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
        if self.level is None:
            return []
        return [Condition("GpuMemoryLeak", "warning", {"uuid": UUID, "gpu": "0", "kind": "gpu"}, "grows", "fix it",
                          level=self.level, hold_for=self.hold_for, fire_on_hold=self.fire_on_hold,
                          evidence=self.evidence)]


def verdicts() -> tuple[RulesEngine, Verdicts]:
    fam = Verdicts()
    spec = FamilySpec("verdicts", fam, {"GpuMemoryLeak": lambda c: c.leak})
    return RulesEngine(RulesConfig(), host="node1", families=(spec,)), fam


def states(eng: RulesEngine, fam: Verdicts, steps: list[tuple[float, Level | None, str | None, float]]) -> list[str]:
    """Evaluate at T0 + each step's second with its (level, evidence, hold); the alert's state after each."""
    out = []
    for s, level, evidence, hold in steps:
        fam.level, fam.evidence, fam.hold_for = level, evidence, hold
        out.append("".join(a.state for a in eng.evaluate(Store(), T0 + s)) or "-")
    return out


def test_a_withdrawn_verdict_lends_its_age_to_no_other_evidence() -> None:
    # The stalling poller's saturating job (bench/detect.py stalled-saturating-from5s-s4, issue 22): an onset
    # verdict (hold 90 s) opened the alert once, was withdrawn; the long window only said "growing" for 5 min,
    # then passed its tests at one evaluation. That raise (hold 300 s) fired at once on the onset's age. It is the
    # window's first raise: its 300 s run from there, and the next raises before then do not fire.
    eng, fam = verdicts()
    steps: list[tuple[float, Level | None, str | None, float]] = [(0, "raise", "onset", 90.0)]
    steps += [(15.0 * i, "hold", "window", 300.0) for i in range(1, 20)]
    steps += [(300, "raise", "window", 300.0), (390, "raise", "window", 300.0), (405, "raise", "window", 300.0)]
    steps += [(420, "hold", "window", 300.0), (590, "hold", "window", 300.0)]
    assert set(states(eng, fam, steps)) == {"pending"}
    assert only(eng.alerts()).active_at == T0  # the alert itself is the one the onset opened
    # A raise of the window's evidence once its own hold has passed since its first raise fires (a stepwise
    # leak's next step: hold levels in between do not reset a kind's clock).
    assert states(eng, fam, [(600, "raise", "window", 300.0)]) == ["firing"]
    assert only(eng.alerts()).fired_at == T0 + 600


def test_the_evidence_that_opened_the_alert_fires_it_on_its_own_hold() -> None:
    eng, fam = verdicts()
    # a short-window verdict (hold 30 s) interrupted by a window verdict of another kind: it fires on its own clock
    seq: list[tuple[float, Level | None, str | None, float]] = [
        (0, "raise", "short window", 30.0), (15, "raise", "window", 300.0), (30, "raise", "short window", 30.0)]
    assert states(eng, fam, seq) == ["pending", "pending", "firing"]
    # the same kind through a stretch of "hold": its next raise past the hold fires (the stepwise leak's step)
    eng, fam = verdicts()
    seq = [(0, "raise", "window", 300.0), (100, "hold", "window", 300.0), (330, "raise", "window", 300.0)]
    assert states(eng, fam, seq) == ["pending", "pending", "firing"]
    # verdicts of two kinds by turns, a raise at every evaluation (the mig scenario's leak: short window, onset,
    # short window, ...): the unbroken run of raises is the evidence, timed from its start
    eng, fam = verdicts()
    seq = [(10.0 * i, "raise", "short window", 200.0) if i % 2 == 0 else (10.0 * i, "raise", "onset", 90.0)
           for i in range(10)]
    assert states(eng, fam, seq) == ["pending"] * 9 + ["firing"]  # at 90 s: the onset's 90 s since the run began
    # a verdict that vanishes ends the episode: a new one starts every kind's clock again
    eng, fam = verdicts()
    seq = [(0, "raise", "onset", 90.0), (15, None, None, 0.0), (30, "raise", "onset", 90.0),
           (105, "raise", "onset", 90.0), (120, "raise", "onset", 90.0)]
    assert states(eng, fam, seq) == ["pending", "-", "pending", "pending", "firing"]


def test_rules_without_evidence_keep_the_for_from_the_alerts_start() -> None:
    # evidence None (every rule but the leak rule): one kind, timed from active_at as in Prometheus; a hold that
    # may fire (fire_on_hold) completes the for: too.
    eng, fam = verdicts()
    fam.fire_on_hold = True
    seq: list[tuple[float, Level | None, str | None, float]] = [
        (0, "raise", None, 60.0), (30, "hold", None, 60.0), (60, "hold", None, 60.0)]
    assert states(eng, fam, seq) == ["pending", "pending", "firing"]
