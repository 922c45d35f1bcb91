"""The trend of a rise's rate and where it levels off (rules/leak/saturation.py), and issue 29's warm-up through the
real engine: a dynamic-shape warm-up rising in irregular steps that decelerate does not fire; a steady 50 MiB/s leak
still fires with most of its time to full left."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.leak.saturation import levels_off, rate_trend
from gpuwatchd.store import Store
from tests.rules.conftest import GIB, MIB, T0, gpu, proc, run, snap, with_processes


def _series(f: object, end: float, step: float = 5.0) -> list[tuple[float, float]]:
    return [(i * step, f(i * step)) for i in range(int(end / step) + 1)]  # type: ignore[operator]


def test_a_saturating_rise_levels_off_where_its_rate_decays() -> None:
    # 6 GiB with a 60 s time constant, seen over its first 2 min: the rate falls to e^-2 of its start.
    pts = _series(lambda s: 6 * GIB * (1 - math.exp(-s / 60)), 120)
    rt = rate_trend(pts, 0.0, 120.0)
    assert rt is not None
    assert rt.ratio < 0.3
    # what is still to come: 6 GiB x e^-2 = 0.81 GiB; the projection is of that order
    assert 0.1 * GIB < rt.to_come < 3 * GIB
    assert levels_off(pts, 0.0, 120.0, headroom=10 * GIB, ratio=0.8, margin=2.0)
    # with the GPU nearly full it does not level off in time: not excused
    assert not levels_off(pts, 0.0, 120.0, headroom=rt.to_come, ratio=0.8, margin=2.0)


def test_a_leak_does_not_level_off() -> None:
    linear = _series(lambda s: 3 * GIB + 50 * MIB * s, 120)
    rt = rate_trend(linear, 0.0, 120.0)
    assert rt is not None and rt.to_come == math.inf and abs(rt.ratio - 1) < 0.1
    assert not levels_off(linear, 0.0, 120.0, headroom=100 * GIB, ratio=0.8, margin=2.0)
    rng = random.Random(3)
    noisy = _series(lambda s: 3 * GIB + 50 * MIB * s + rng.gauss(0, 40 * MIB), 120)
    assert not levels_off(noisy, 0.0, 120.0, headroom=100 * GIB, ratio=0.8, margin=2.0)
    # a staircase leak: a step of 1 GiB every 20 s; most of its floors' rates are 0, and so is their trend
    stairs = _series(lambda s: 3 * GIB + (s // 20) * GIB, 240)
    assert not levels_off(stairs, 0.0, 240.0, headroom=100 * GIB, ratio=0.8, margin=2.0)


def test_a_flat_or_falling_series_has_no_rate_trend() -> None:
    assert rate_trend(_series(lambda s: 5 * GIB, 120), 0.0, 120.0) is None
    assert rate_trend(_series(lambda s: 5 * GIB - s * MIB, 120), 0.0, 120.0) is None
    assert rate_trend([(0.0, 1.0), (5.0, 2.0)], 0.0, 10.0) is None


RISE, DECEL, START = 150.0, 1.8, 30.0


def _issue_warm_up(seed: int) -> list[tuple[float, float]]:
    """Issue 29's trace: from ~3 GiB up to ~7.5 GiB within ~2 min in irregular steps of 64-256 MiB, the rate
    falling as the allocator's cache fills (the rise's share done by t is 1 - (1 - t/2.5 min)^1.8: concave, its last
    third far slower than its first), flat for tens of seconds, then 64 MiB bumps at longer and longer gaps,
    below 9 GiB after 40 min. (time, size) of each step."""
    rng = random.Random(seed)
    sizes: list[float] = []
    while sum(sizes) < 4.5 * GIB:
        sizes.append(rng.uniform(64, 256) * MIB)
    steps: list[tuple[float, float]] = []
    t = prev = 0.0
    done = 0.0
    for z in sizes:
        done += z
        at = RISE * (1 - (1 - min(1.0, done / sum(sizes))) ** (1 / DECEL))
        t += max(0.5, (at - prev) * rng.uniform(0.5, 1.5))
        prev = at
        steps.append((START + t, z))
    t = steps[-1][0] + rng.uniform(30, 60)  # flat for tens of seconds
    gap, added = 40.0, 0.0
    while t < 2400 and added < 1.2 * GIB:
        steps.append((t, 64 * MIB))
        added += 64 * MIB
        t += gap
        gap *= 1.3
    return steps


def _first_firing(series: object, config: RulesConfig, *, end: float, total: int = 16 * GIB) -> float | None:
    engine = RulesEngine(config, host="node1")

    def make(t: float):  # type: ignore[no-untyped-def]
        g = replace(gpu(), memory_total_bytes=total)
        return snap(t, with_processes(g, [proc(4242, series(t - T0))]))  # type: ignore[operator]

    hist = run(Store(retention_seconds=3600.0, step_seconds=5.0), engine, make, start=T0, end=T0 + end, every=5.0)
    firing: list[tuple[float, Alert]] = [(t, a) for t, alerts in hist for a in alerts
                                         if a.name == "GpuMemoryLeak" and a.state == "firing"]
    return firing[0][0] - T0 if firing else None


def test_issue_29_dynamic_shape_warm_up_mostly_does_not_fire() -> None:
    # Eight draws of the issue's warm-up (step sizes and gaps at random). Before the rate's trend was asked, seven
    # fired 105-165 s in; now two do (their gaps, jittered by up to 50 %, keep the rise straight until ~90 s in,
    # past a third of the time a leak that fast would take to fill the GPU: docs/alerts.md, the limit).
    fired, fired_unguarded = [], []
    for seed in range(8):
        steps = _issue_warm_up(seed)

        def series(s: float, steps: list[tuple[float, float]] = steps) -> float:
            return 3 * GIB * min(1.0, s / 20) + sum(z for x, z in steps if s >= x)

        assert series(2400) < 9 * GIB
        fired.append(_first_firing(series, RulesConfig(), end=600))
        # Without the trend of the rate (warmup_rate_ratio 0: no rise counts as decelerating).
        fired_unguarded.append(_first_firing(series, validate(RulesConfig, {"leak": {"warmup_rate_ratio": 0}}),
                                             end=300))
    assert sum(t is not None for t in fired_unguarded) >= 6
    assert sum(t is not None for t in fired) <= 2


def test_a_steady_50_mib_per_second_leak_still_fires_with_most_of_its_time_left() -> None:
    def series(s: float) -> float:
        return 3 * GIB * min(1.0, s / 8) + 50 * MIB * max(0.0, s - 10)

    # On the 24 GiB GPU of bench/detect.py's corpus (~77 % of its time to full left before issue 29); on 16 GiB the
    # same leak fills the GPU ~4 min after it began and the alert comes ~95 s into it, with ~0.63 of that left.
    full = 10 + (24 * GIB - 300 * MIB - 3 * GIB) / (50 * MIB)  # ~414 s from its start
    fired = _first_firing(series, RulesConfig(), end=full, total=24 * GIB)
    assert fired is not None
    assert (full - fired) / (full - 10) >= 0.7
