"""GpuMemoryLeak on synthetic memory timelines: leaks of several rates and shapes fire with an accurate
time-to-OOM; plateaus, evaluation spikes, stepwise warm-up and job restarts stay silent."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, Snapshot
from gpuwatchd.rules import leak
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import FAMILIES, RulesEngine
from gpuwatchd.store import Store
from tests.rules.conftest import GIB, MIB, T0, gpu, proc, run, snap, with_processes

Series = Callable[[float], float]  # seconds since start -> bytes


def leak_alerts(history: list[tuple[float, list[Alert]]], kind: str = "gpu") -> list[tuple[float, Alert]]:
    return [
        (t, a)
        for t, alerts in history
        for a in alerts
        if a.name == "GpuMemoryLeak" and a.labels.get("kind") == kind and a.state == "firing"
    ]


def single_process(series: Series, pid: int = 4242) -> Callable[[float], Snapshot]:
    return lambda t: snap(t, with_processes(gpu(), [proc(pid, series(t - T0))]))


def simulate(make: Callable[[float], Snapshot], minutes: float, every: float = 60.0) -> list[tuple[float, list[Alert]]]:
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    engine = RulesEngine(RulesConfig(), host="node1")
    return run(store, engine, make, start=T0, end=T0 + minutes * 60, every=every)


def warmup(t: float, level: float = 6 * GIB, over: float = 180.0) -> float:
    """Caching-allocator warm-up: fast rise to a level over ``over`` seconds (concave)."""
    return level * (1 - math.exp(-3 * t / over))


# -- leaks -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate_mib_min", [20.0, 64.0, 256.0])
def test_linear_leak_fires_with_accurate_time_to_oom(rate_mib_min: float) -> None:
    rate = rate_mib_min * MIB / 60
    hist = simulate(lambda t: snap(t, with_processes(gpu(), [proc(4242, warmup(t - T0) + rate * (t - T0))])), 45)
    fired = leak_alerts(hist)
    assert fired, "a linear leak must fire"
    t, a = fired[0]
    assert a.labels["pid"] == "4242" and a.labels["process"] == "python" and a.severity == "warning"
    assert t - T0 <= 30 * 60  # within min_span + for + one window half
    # true time to OOM at detection: free memory / true rate
    used = 300 * MIB + warmup(t - T0) + rate * (t - T0)
    true_eta = (24 * GIB - used) / rate
    assert a.value is not None
    assert abs(a.value - true_eta) / true_eta < 0.10
    assert f"grows {rate_mib_min:.1f} MiB/min" in a.summary or "MiB/min" in a.summary
    assert "full in ~" in a.summary and a.summary.startswith("GPU 0 (NVIDIA A10G): python[4242] grows")
    spark = a.annotations["sparkline"]
    assert 4 <= len(spark) <= 20 and set(spark) <= set("▁▂▃▄▅▆▇█") and spark[-1] == "█"


def test_summary_numbers() -> None:
    rate = 38.2 * MIB / 60
    hist = simulate(lambda t: snap(t, with_processes(gpu(), [proc(4242, 16 * GIB + rate * (t - T0))])), 25)
    _, a = leak_alerts(hist)[0]
    assert "grows 38.2 MiB/min" in a.summary
    assert "/24.0 GiB used" in a.summary


def test_stepwise_leak_fires() -> None:
    # +256 MiB every 5 minutes (a cache that never evicts, one entry per epoch)
    hist = simulate(single_process(lambda s: 4 * GIB + 256 * MIB * (s // 300)), 60)
    assert leak_alerts(hist)


def test_noisy_leak_with_spikes_fires() -> None:
    rng = random.Random(7)

    def series(s: float) -> float:
        spike = 3 * GIB if (s % 600) < 45 else 0.0  # evaluation pass every 10 min
        return 5 * GIB + 40 * MIB / 60 * s + rng.gauss(0, 30 * MIB) + spike

    assert leak_alerts(simulate(single_process(series), 60))


# -- non-leaks ---------------------------------------------------------------------------------------------------


def test_plateau_after_warmup_with_evaluation_spikes_is_silent() -> None:
    rng = random.Random(1)

    def series(s: float) -> float:
        spike = 4 * GIB if (s % 600) > 540 else 0.0  # a 60 s evaluation pass every 10 min
        return warmup(s, 10 * GIB) + spike + rng.gauss(0, 20 * MIB)

    hist = simulate(single_process(series), 90)
    assert not [a for _, alerts in hist for a in alerts if a.name == "GpuMemoryLeak"]


def test_stepwise_warmup_is_silent() -> None:
    # The allocator grows its pool in steps (first batches, first evaluation pass, first checkpoint) and stops
    # within min_span. (A pool still stepping 10-15 min in is indistinguishable from a stepwise leak until the
    # steps stop; docs/alerts.md says so.)
    steps = [0, 60, 150, 300, 480]

    def series(s: float) -> float:
        return 2 * GIB + GIB * sum(1 for x in steps if s >= x)

    hist = simulate(single_process(series), 80)
    assert not leak_alerts(hist)
    # It may look like a staircase for a moment (pending), but never fires and leaves nothing behind.
    assert hist[-1][1] == []


def test_job_restart_is_not_a_leak() -> None:
    # pid 100 runs 35 min; pid 101 takes over, warms up to a higher plateau
    def make(t: float) -> Snapshot:
        s = t - T0
        p = proc(100, warmup(s, 8 * GIB)) if s < 35 * 60 else proc(101, warmup(s - 35 * 60, 12 * GIB))
        return snap(t, with_processes(gpu(), [p]))

    hist = simulate(make, 80)
    assert not leak_alerts(hist)
    assert not leak_alerts(hist, "unattributed")


def test_slow_drift_below_min_rate_is_silent() -> None:
    hist = simulate(single_process(lambda s: 8 * GIB + 0.5 * MIB / 60 * s), 60)
    assert not leak_alerts(hist)


def test_insignificant_growth_far_from_full_is_silent() -> None:
    # 4 MiB/min on a mostly empty GPU: over a day from full and < 10% of memory in the window
    hist = simulate(single_process(lambda s: 2 * GIB + 4 * MIB / 60 * s), 60)
    assert not leak_alerts(hist)


# -- unattributed and host RSS -------------------------------------------------------------------------------------


def test_unattributed_growth_fires_without_pid() -> None:
    rate = 50 * MIB / 60

    def make(t: float) -> Snapshot:
        s = t - T0
        return snap(t, with_processes(gpu(), [proc(7, 6 * GIB)], overhead=int(300 * MIB + rate * s)))

    fired = leak_alerts(simulate(make, 45), "unattributed")
    assert fired
    a = fired[0][1]
    assert "pid" not in a.labels and "not attributed" in a.summary and a.value is not None


def test_unattributed_skipped_when_process_list_is_cut() -> None:
    rate = 50 * MIB / 60

    def make(t: float) -> Snapshot:
        g = with_processes(gpu(), [proc(7, 6 * GIB)], overhead=int(300 * MIB + rate * (t - T0)))
        return snap(t, g.__class__(**{**{f: getattr(g, f) for f in g.__slots__}, "processes_total": 5}))

    assert not leak_alerts(simulate(make, 45), "unattributed")


def test_host_rss_growth_fires() -> None:
    def make(t: float) -> Snapshot:
        s = t - T0
        return snap(t, with_processes(gpu(), [proc(4242, 6 * GIB, rss=4 * GIB + 60 * MIB / 60 * s)]))

    hist = simulate(make, 45)
    fired = leak_alerts(hist, "host_rss")
    assert fired and not leak_alerts(hist)
    a = fired[0][1]
    assert a.labels["pid"] == "4242" and "host RSS grows" in a.summary and a.value is not None and a.value > 0


def test_leak_resolves_when_memory_is_freed() -> None:
    def series(s: float) -> float:
        return 4 * GIB + 100 * MIB / 60 * s if s < 40 * 60 else 2 * GIB

    hist = simulate(single_process(series), 60)
    states = [a.state for _, alerts in hist for a in alerts if a.name == "GpuMemoryLeak"]
    assert "firing" in states and states[-1] == "resolved"


def raises_and_firings(
    series: Series, config: RulesConfig, *, start: float, end: float
) -> tuple[list[float], list[float]]:
    """Seconds (since T0) of the leak evaluations whose ``kind=gpu`` verdict was a raise, and of the firing alerts,
    through the real engine at the daemon's leak interval (15 s)."""
    raised: list[float] = []

    def family(view: RuleView, now: float, cfg: RulesConfig) -> list[Condition]:
        out = leak.conditions(view, now, cfg)
        raised.extend(now - T0 for c in out if c.level == "raise" and c.labels.get("kind") == "gpu")
        return out

    fams = tuple(replace(f, evaluate=family) if f.name == "leak" else f for f in FAMILIES)
    engine = RulesEngine(config, host="node1", families=fams)
    hist = run(Store(retention_seconds=3600.0, step_seconds=5.0), engine, single_process(series), start=start,
               end=end, every=15.0)
    return raised, [t - T0 for t, _ in leak_alerts(hist)]


def _stalls(seed: int) -> list[tuple[float, float]]:
    """A loaded host's poller: stalled 5-20 s at a time, every 20-90 s."""
    rng = random.Random(seed)
    out, t = [], rng.uniform(0, 60)
    while t < 4000:
        length = rng.uniform(5, 20)
        out.append((t, t + length))
        t += length + rng.uniform(20, 90)
    return out


def test_young_saturating_job_read_through_a_stalling_poller_is_silent() -> None:
    # A job saturating at 6 GiB with a 15 min time constant, seen from its start through a poller whose readings
    # stay flat 5-20 s at a time, then jump (issue 22). Its long window looks like a leak at ~13 min; the trend of
    # its rate (the recent half flattens, and where it levels off the GPU has most of its memory left) says not.
    stalls = _stalls(1)

    def series(s: float) -> float:
        x = next((a for a, b in stalls if a <= s < b), s)  # the reading a stalled poller still shows
        return warmup(x, 3 * GIB, 120.0) + 6 * GIB * (1 - math.exp(-x / 900.0))

    raised, fired = raises_and_firings(series, RulesConfig(), start=T0, end=T0 + 1800)
    assert fired == []
    # Without the level-off test (young_age 0: no process counts as young) the long window raises ~13 min in.
    # Before the engine timed each kind of evidence on its own (issue 22) that one raise fired, on the age of
    # the alert an earlier verdict had opened; now it would have to go on for its own hold, so two guards hold.
    # (The trend of the rate across the evidence, issue 29, is a third guard on the long window: off here too.)
    raised_unguarded, fired = raises_and_firings(
        series, validate(RulesConfig, {"leak": {"young_age": 0, "warmup_rate_ratio": 0}}), start=T0, end=T0 + 1800)
    assert fired == []
    assert [t for t in raised_unguarded if t > 600] and not [t for t in raised if t > 600]


def test_young_warm_up_stepping_ever_more_rarely_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    # A dynamic-shapes warm-up with a steady stream of shapes (issue 22): ~170 MiB steps, each gap ~6 % longer
    # than the one before, levelling off 5 GiB up; watched from 5 s in. Its onset fit is clean and straight for
    # minutes and its steps pass as a regular staircase; the intervals that keep growing say it is decelerating.
    rng = random.Random(1)
    steps, gap, t, done = [], 7.0, 0.0, 0.0
    while done < 5 * GIB:
        t += gap * rng.uniform(0.9, 1.1)
        z = 170 * MIB * rng.uniform(0.85, 1.15)
        steps.append((t, z))
        done += z
        gap *= 1.06

    def series(s: float) -> float:
        return 5 * GIB * (1 - math.exp(-3 * s / 120)) + sum(z for x, z in steps if s >= x)

    raised, fired = raises_and_firings(series, RulesConfig(), start=T0 + 5, end=T0 + 1500)
    assert fired == []
    # Without the spreading test its onset raises again ~10 min in, which fired before the engine timed each kind
    # of evidence on its own (issue 22): the alert an earlier verdict had opened lent it its age.
    # (The trend of the rate across the evidence, issue 29, is another guard: off here too.)
    monkeypatch.setattr("gpuwatchd.rules.leak.spreading", lambda *a, **k: False)
    raised_unguarded, fired = raises_and_firings(
        series, validate(RulesConfig, {"leak": {"warmup_rate_ratio": 0}}), start=T0 + 5, end=T0 + 1500)
    assert fired == []
    assert [t for t in raised_unguarded if t > 540] and not [t for t in raised if t > 540]
