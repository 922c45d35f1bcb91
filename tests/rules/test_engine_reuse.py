"""What the engine reuses between evaluations (a family's cached conditions fingerprinted once, a firing alert given
the same condition object again, the sorted order of the alerts) changes no result: an engine that drops all of it
before every evaluation, so every condition takes the full path, gives the same alerts, the same internal timing,
the same ``changes`` and the same ``gpuwatchd_alerts`` at every evaluation of a fleet whose processes die, are
released, shrink, leak and whose GPU runs hot, loses its processes and comes back at another index, across a reload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import gpuwatchd.rules.engine as engine_mod
from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, ProcessSample, Snapshot, XidEvent, fingerprint
from gpuwatchd.rules import dead_process
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import FamilySpec, RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector
from gpuwatchd.store import Store

from .conftest import GIB, MIB, T0, UUID, gpu, proc, snap, with_processes

UUID1 = "GPU-5a3c1b2e-0000-4000-8000-000000000001"


class FullPath(RulesEngine):
    """The engine with nothing kept from one evaluation to the next: every condition fingerprinted and applied, and
    the dead-process family making every condition anew."""

    def evaluate(self, view: Any, now: float) -> list[Alert]:
        self._collected.clear()
        self._order = None
        for t in self._tracked.values():
            t.applied = None
        kept = dead_process._LAST
        dead_process._LAST = dead_process._Last()
        try:
            return super().evaluate(view, now)
        finally:
            dead_process._LAST = kept


_DECODED: dict[tuple[int, float, str, float], ProcessSample] = {}


def _dead(pid: int, used: float, state: str, died: float, t: float) -> ProcessSample:
    """A dead process as the daemon's decoder hands it over: the object of its first poll while it stays the same
    (its age as of then, ``host_state_at``)."""
    key = (pid, used, state, died)
    p = _DECODED.get(key)
    if p is None:
        p = _DECODED[key] = replace(proc(pid, used), host_state=state, host_state_seconds=t - died, host_state_at=t)
    return p


def _fleet(t: float) -> Snapshot:
    s = t - T0
    procs0 = [
        proc(100, 4 * GIB + 200 * MIB / 60 * min(s, 25 * 60), rss=1 * GIB),  # leaks 25 min, then holds
        _dead(200, 6 * GIB, "gone", T0 + 30, t) if s >= 30 else replace(proc(200, 6 * GIB), host_state="live"),
        _dead(202, 32 * MIB, "gone", T0 + 90, t) if s >= 90 else proc(202, 32 * MIB),  # under min_memory_bytes
        _dead(203, (3 * GIB) if s < 420 else 16 * MIB, "gone", T0 + 20, t) if s >= 20 else proc(203, 3 * GIB),
    ]
    if s >= 60:
        procs0.append(_dead(201, 1 * GIB, "zombie", T0 + 60, t))
    if s >= 600:  # dies 70 s before the reload: pending across it (the same words), due at once on the new hold
        procs0.append(_dead(205, 1 * GIB, "gone", T0 + 630, t) if s >= 630 else proc(205, 1 * GIB))
    if s < 400:  # released at 400 s: a gone note, then resolved
        procs0.append(_dead(204, 2 * GIB, "gone", T0 + 5, t) if s >= 5 else proc(204, 2 * GIB))
    temp = 93.0 if 50 <= s < 200 or 260 <= s < 280 else 88.0 if 200 <= s < 230 else 60.0
    g0 = replace(with_processes(gpu(), procs0), temperature_celsius=temp)
    index1 = 1 if s < 600 else 2  # re-enumerated at another index (a hot-add shifted it)
    if 100 <= s < 500:  # memory used, no process listed
        g1 = replace(gpu(UUID1, index1), processes=(), processes_total=0, memory_used_bytes=8 * GIB)
    else:
        g1 = with_processes(gpu(UUID1, index1), [_dead(300, 4 * GIB, "gone", T0 + 10, t) if s >= 10
                                                 else proc(300, 4 * GIB)])
    xids = (XidEvent(UUID, 79, t),) if s == 200 else ()
    return snap(t, g0, g1, host_pid_namespace=True, xid_events=xids)


def _exposition(collector: AlertsCollector) -> list[bytes]:
    """The ``gpuwatchd_alerts`` lines (the durations of the other families differ from run to run)."""
    reg = CollectorRegistry()
    reg.register(collector)
    return [line for line in generate_latest(reg).splitlines() if b"gpuwatchd_alerts" in line]


@pytest.mark.parametrize(("step", "minutes"), [(1.0, 15), (5.0, 40)])  # the daemon's 1 s; the leak's whole course
def test_reuse_changes_nothing(step: float, minutes: float, monkeypatch: pytest.MonkeyPatch) -> None:
    _DECODED.clear()
    counts = {"fingerprint": 0}

    def counted(labels: dict[str, str]) -> str:
        counts["fingerprint"] += 1
        return fingerprint(labels)

    monkeypatch.setattr(engine_mod, "fingerprint", counted)
    settings: dict[str, Any] = {"leak": {"keep_firing_for": "60s"}, "temperature": {"for": "20s"},
                                # holds that end between two runs of the family (every 10 s)
                                "dead_process": {"for": "125s", "unattributed_for": "33s"}}
    config = validate(RulesConfig, settings)
    fast, full = RulesEngine(config, host="node1"), FullPath(config, host="node1")
    fast_metrics, full_metrics = AlertsCollector(fast), AlertsCollector(full)
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    fingerprints = {"fast": 0, "full": 0}
    timings = {"fast": 0, "full": 0}  # conditions that took the full path of _advance (each looks its timing up)
    for name, eng in (("fast", fast), ("full", full)):
        def timing(family: str, alertname: str, name: str = name, eng: RulesEngine = eng) -> Any:
            timings[name] += 1
            return RulesEngine._timing(eng, family, alertname)
        monkeypatch.setattr(eng, "_timing", timing)
    seen_states: set[tuple[str, str]] = set()
    reloaded = False
    t = T0
    while t <= T0 + minutes * 60:
        if t - T0 >= 700 and not reloaded:  # a reload: the dead-process hold shorter
            config = validate(RulesConfig, {**settings, "dead_process": {"for": "65s", "unattributed_for": "33s"}})
            fast.reconfigure(config)
            full.reconfigure(config)
            reloaded = True
        store.apply(_fleet(t))
        for name, eng in (("fast", fast), ("full", full)):
            counts["fingerprint"] = 0
            eng.evaluate(store, t)
            fingerprints[name] += counts["fingerprint"]
        assert fast.alerts() == full.alerts(), t - T0
        assert fast.changes == full.changes, t - T0
        assert {fp: (x.last_held, x.since, x.run_since) for fp, x in fast._tracked.items()} == {
            fp: (x.last_held, x.since, x.run_since) for fp, x in full._tracked.items()}, t - T0
        assert _exposition(fast_metrics) == _exposition(full_metrics), t - T0
        seen_states |= {(a.name, a.state) for a in fast.alerts()}
        t += step
    # the fleet went through what the reuse has to get right ...
    for name in ("GpuMemoryHeldByDeadProcess", "GpuTemperatureHigh") + (("GpuMemoryLeak",) if minutes > 30 else ()):
        assert {(name, "firing"), (name, "resolved")} <= seen_states, (name, seen_states)
    assert ("GpuXidError", "firing") in seen_states
    # ... and the reuse was taken
    assert fingerprints["fast"] < fingerprints["full"] and timings["fast"] < timings["full"], (fingerprints, timings)


def test_a_firing_alert_given_its_condition_again_only_holds() -> None:
    # The fast path of _advance: the same condition object again (a family between its runs) keeps the alert
    # object as it is and moves only last_held; a new, equal condition takes the full path with the same result.
    config = validate(RulesConfig, {"dead_process": {"for": "0s", "interval": "60s"}})
    eng = RulesEngine(config, host="node1")
    store = Store()
    make: Callable[[float], Snapshot] = lambda t: snap(  # noqa: E731
        t, with_processes(gpu(), [_dead(7, 1 * GIB, "gone", T0 - 30, t)]), host_pid_namespace=True)
    store.apply(make(T0))
    (a0,) = eng.evaluate(store, T0)
    assert a0.state == "firing"
    (tracked,) = eng._tracked.values()
    applied = tracked.applied
    assert applied is not None
    for s in (1.0, 2.0, 59.0):
        store.apply(make(T0 + s))
        (a,) = eng.evaluate(store, T0 + s)
        assert a is a0 and tracked.applied is applied and tracked.last_held == T0 + s
    store.apply(make(T0 + 60))
    (a,) = eng.evaluate(store, T0 + 60)  # the family ran again: new conditions, the age in the words moved
    assert a.summary.endswith("(1m ago); 1.3/24.0 GiB used; find the holder with `fuser -v /dev/nvidia*`, reset the "
                              "GPU if none")
    assert replace(a, summary=a0.summary) == a0 and tracked.applied is not applied and tracked.last_held == T0 + 60


class Script:
    """A family saying what a test scripts, from ``at``: a list of (from second, conditions) steps."""

    def __init__(self, steps: list[tuple[float, list[Condition]]]) -> None:
        self.steps = steps

    def __call__(self, view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
        out: list[Condition] = []
        for at, conds in self.steps:
            if now - T0 >= at:
                out = conds
        return list(out)


def test_a_cached_note_words_a_resolution_once_its_alert_fires() -> None:
    # A family between its runs (every 60 s) keeps a note it made while no alert of its name fired (then skipped);
    # another family's alert of that identity fires, then clears: the note words the resolution, as it would if
    # its family had run then.
    labels = {"uuid": UUID, "gpu": "0", "model": "NVIDIA A10G"}
    note = Condition("GpuTemperatureHigh", "warning", labels, "cooled down to 60 °C", "", level="clear")
    hot = Condition("GpuTemperatureHigh", "warning", labels, "hot", "cool it", value=93.0)
    families = (
        FamilySpec("notes", Script([(0, [note])]), {"GpuTemperatureHigh": lambda c: c.temperature}, lambda c: 60.0),
        FamilySpec("raises", Script([(5, [hot]), (20, [])]), {"GpuTemperatureHigh": lambda c: c.temperature}),
    )
    config = validate(RulesConfig, {"temperature": {"for": "0s"}})
    fast = RulesEngine(config, host="node1", families=families)
    full = FullPath(config, host="node1", families=families)
    for s in range(0, 40):
        assert fast.evaluate(Store(), T0 + s) == full.evaluate(Store(), T0 + s), s
    (a,) = fast.alerts()
    assert a.state == "resolved" and a.resolved_at == T0 + 20 and a.summary == "cooled down to 60 °C"


def test_rewording_an_alert_keeps_every_other_field() -> None:
    # engine._reworded spells dataclasses.replace out: a field added to Alert must be carried over there too.
    a = Alert(name="GpuTemperatureHigh", severity="warning", labels={"alertname": "GpuTemperatureHigh"}, summary="s",
              description="d", state="pending", active_at=T0, fired_at=None, resolved_at=T0 + 1, value=1.0,
              annotations={"x": "1"})
    c = Condition("GpuTemperatureHigh", "warning", {}, "s2", "d2", value=2.0, annotations={"y": "2"})
    assert {f.name for f in fields(Alert)} == {"name", "severity", "labels", "summary", "description", "state",
                                               "active_at", "fired_at", "resolved_at", "value", "annotations"}
    assert engine_mod._reworded(a, c, "firing", T0 + 2, labels=a.labels, annotations=dict(c.annotations)) == replace(
        a, summary="s2", description="d2", value=2.0, annotations=dict(c.annotations), state="firing",
        fired_at=T0 + 2)
    assert c.annotations["y"] == "2" and c.annotations["action"]  # the alertname's advice (rules/advice.py)
