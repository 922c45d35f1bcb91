"""Robust growth trend of a memory series: lower envelope + Theil-Sen slope, plateau-aware.

Why Theil-Sen (the median of all pairwise slopes): it ignores up to ~29% outliers (breakdown point), needs no
noise model and no tuning, and unlike least squares one evaluation spike or one bad reading cannot tilt it.
Its O(n²) cost is kept small by running it on one point per bucket (30 points for a 30 min window at 1 min
buckets: 435 pairs), so the daemon needs no numpy.

Why a lower envelope first: GPU memory of a healthy job goes *up and back down* (evaluation passes, cuDNN
workspaces, gradient buckets) but its floor stays put, while a leak raises the floor. So each bucket becomes its
median (drops spikes and dips shorter than half a bucket) and then the series becomes its *suffix minimum*
(``env[i] = min(v[i:])``): a spike that later returns, however long, no longer shows, and the envelope only
rises if the memory never came back down. A job restart (pid gone, new pid) is a new series.

The decision (``assess``) asks four things, all must hold:
(a) sustained: the slope over the window and over its recent half both >= a minimum rate, and the recent one
    >= a share of the whole (warm-up is concave: fast then flat, and fails this);
(b) monotonic-ish: the envelope rose (by construction it only rises when the floor rose);
(c) enough span of history;
(d) significant: projected time-to-full within a horizon, or growth over the window >= a share of capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

SPARK = "▁▂▃▄▅▆▇█"


def theil_sen(points: Sequence[tuple[float, float]]) -> float:
    """Median of pairwise slopes (units per second); 0.0 with fewer than two distinct times."""
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for (t2, v2) in points[i + 1 :]
        if t2 != t1
    ]
    return median(slopes) if slopes else 0.0


def bucket_medians(points: Sequence[tuple[float, float]], bucket: float) -> list[tuple[float, float]]:
    """One (mean time, median value) per ``bucket`` seconds, buckets aligned to the first point."""
    if not points:
        return []
    t0 = points[0][0]
    out: list[tuple[float, float]] = []
    cur_key: int | None = None
    ts: list[float] = []
    vs: list[float] = []
    for t, v in points:
        key = int((t - t0) // bucket)
        if key != cur_key and ts:
            out.append((sum(ts) / len(ts), median(vs)))
            ts, vs = [], []
        cur_key = key
        ts.append(t)
        vs.append(v)
    if ts:
        out.append((sum(ts) / len(ts), median(vs)))
    return out


def lower_envelope(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Suffix minimum: each value becomes the lowest value from there to the end."""
    out: list[tuple[float, float]] = []
    low = float("inf")
    for t, v in reversed(points):
        low = min(low, v)
        out.append((t, low))
    out.reverse()
    return out


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """``▁▂▃▄▅▆▇█`` text sparkline of ``values`` resampled to ``width`` characters."""
    if not values:
        return ""
    n = len(values)
    if n > width:
        values = [values[min(n - 1, round(i * (n - 1) / (width - 1)))] for i in range(width)]
    lo, hi = min(values), max(values)
    if hi - lo <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * len(SPARK)))] for v in values)


@dataclass(frozen=True, slots=True)
class Trend:
    """The measurements behind a leak decision (kept for the message and for tests)."""

    span: float  # seconds of history in the window
    rate: float  # bytes/s over the whole window (Theil-Sen on the envelope)
    recent_rate: float  # bytes/s over the recent half
    growth: float  # envelope rise over the window, bytes
    current: float  # latest value (bucket median), bytes
    envelope: tuple[float, ...]  # for the sparkline


def measure(points: Sequence[tuple[float, float]], *, now: float, window: float, bucket: float) -> Trend | None:
    """Trend of ``(t, value)`` points over ``[now - window, now]``; None with fewer than 4 buckets."""
    pts = [(t, v) for t, v in points if now - window <= t <= now]
    if len(pts) < 2:
        return None
    buckets = bucket_medians(pts, bucket)
    if len(buckets) < 4:
        return None
    env = lower_envelope(buckets)
    half_t = env[-1][0] - (env[-1][0] - env[0][0]) / 2
    recent = [p for p in env if p[0] >= half_t]
    return Trend(
        span=pts[-1][0] - pts[0][0],
        rate=theil_sen(env),
        recent_rate=theil_sen(recent) if len(recent) >= 2 else 0.0,
        growth=env[-1][1] - env[0][1],
        current=buckets[-1][1],
        envelope=tuple(v for _, v in env),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """``leak``: all of (a)-(d) hold; ``growing``: still trending up (hysteresis: keeps a firing alert)."""

    leak: bool
    growing: bool
    eta_seconds: float | None  # projected time until ``capacity`` is reached, at the recent rate


def assess(
    trend: Trend,
    *,
    min_span: float,
    min_rate: float,
    min_recent_ratio: float,
    free: float | None,
    horizon: float,
    min_growth: float,
) -> Verdict:
    """Apply (a)-(d) to a trend. ``free``: bytes left before full (None: no projection, growth test only)."""
    rate = max(trend.recent_rate, 0.0)
    eta = free / rate if free is not None and rate > 0 else None
    if eta is not None:
        eta = max(0.0, eta)
    growing = trend.rate >= min_rate / 2 and trend.recent_rate > 0 and trend.growth > 0
    sustained = (
        trend.rate >= min_rate
        and trend.recent_rate >= min_rate
        and trend.recent_rate >= min_recent_ratio * trend.rate
    )
    rose = trend.growth > 0
    enough = trend.span >= min_span
    significant = (eta is not None and eta <= horizon) or trend.growth >= min_growth
    return Verdict(leak=sustained and rose and enough and significant, growing=growing, eta_seconds=eta)
