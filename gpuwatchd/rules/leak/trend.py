"""Robust growth trend of a memory series: lower envelope + Theil-Sen slope, plateau-aware.

Why Theil-Sen (the median of all pairwise slopes): it ignores up to ~29% outliers (breakdown point), needs no
noise model and no tuning, and unlike least squares one evaluation spike or one bad reading cannot tilt it.
Its O(n²) cost is kept small by running it on one point per bucket (30 points for a 30 min window at 1 min
buckets: 435 pairs), so the daemon needs no numpy.

Why a lower envelope first: GPU memory of a healthy job goes *up and back down* (evaluation passes, cuDNN
workspaces, gradient buckets) but its floor stays put, while a leak raises the floor. So each bucket becomes its
floor (a low quantile: spikes vanish, a lone bad low reading does not count) and then the series becomes its
*suffix minimum* (``env[i] = min(v[i:])``): a spike that later returns, however long, no longer shows, and the
envelope only rises if the memory never came back down. A job restart (pid gone, new pid) is a new series.
The suffix minimum of a noisy plateau creeps up at its very end (fewer values left to take the minimum of);
the "at least two rises" and "above the noise" tests below keep that from looking like growth.

The decision (``assess``) asks four things, all must hold:
(a) sustained: the slope over the window and over its recent half both >= a minimum rate, and the recent one
    >= a share of the whole (warm-up is concave: fast then flat, and fails this);
(b) monotonic-ish: the envelope rose at least twice in the recent half, by more than the noise (by construction
    it only rises when the floor rose, apart from the suffix minimum of noise creeping up at the very end);
(c) enough span of history;
(d) significant: growth over the window >= a small share of capacity, and either the projected time-to-full
    (at the slower of the two slopes) within a horizon or growth >= a larger share of capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
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


# Each bucket is summarised by this quantile of its samples: a floor that skips a lone bad low reading (with
# 12 samples per minute it is the second lowest) but sees a level the series returns to in >= ~15% of samples
# (csv04: inference that frees memory between batches swings 17.9 -> 17.4 GB about a quarter of the time).
FLOOR_QUANTILE = 0.1


def bucket_stats(points: Sequence[tuple[float, float]], bucket: float) -> list[tuple[float, float, float]]:
    """One (mean time, floor, peak) per ``bucket`` seconds, buckets aligned to the first point; the floor is the
    ``FLOOR_QUANTILE`` of the bucket's values, the peak its maximum."""
    out: list[tuple[float, float, float]] = []
    if not points:
        return out
    t0 = points[0][0]
    cur_key: int | None = None
    ts: list[float] = []
    vs: list[float] = []

    def flush() -> None:
        vs.sort()
        out.append((sum(ts) / len(ts), vs[int(FLOOR_QUANTILE * len(vs))], vs[-1]))

    for t, v in points:
        key = int((t - t0) // bucket)
        if key != cur_key and ts:
            flush()
            ts, vs = [], []
        cur_key = key
        ts.append(t)
        vs.append(v)
    if ts:
        flush()
    return out


def bucket_floors(points: Sequence[tuple[float, float]], bucket: float) -> list[tuple[float, float]]:
    """One (mean time, floor) per ``bucket`` seconds."""
    return [(t, floor) for t, floor, _ in bucket_stats(points, bucket)]


def lower_envelope(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Suffix minimum: each value becomes the lowest value from there to the end."""
    out: list[tuple[float, float]] = []
    low = float("inf")
    for t, v in reversed(points):
        low = min(low, v)
        out.append((t, low))
    out.reverse()
    return out


def robust_noise(points: Sequence[tuple[float, float]]) -> float:
    """Sigma of the scatter around the series' robust line: MAD of the residuals from its Theil-Sen fit, scaled
    to a normal sigma (x1.4826). Residuals, not first differences: a series flipping between two levels
    (csv04) has small differences but a wide scatter."""
    if len(points) < 3:
        return 0.0
    slope = theil_sen(points)
    t0 = points[0][0]
    intercept = median(v - slope * (t - t0) for t, v in points)
    resid = [v - (intercept + slope * (t - t0)) for t, v in points]
    mid = median(resid)
    return 1.4826 * median(abs(r - mid) for r in resid)


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
    recent_growth: float  # envelope rise over the recent half, bytes
    recent_rises: int  # buckets of the recent half where the envelope rose
    noise: float  # robust sigma of the bucket floors around their trend line, bytes
    current: float  # latest value (bucket floor), bytes
    latest: float  # latest raw value, bytes
    excursion: float  # highest peak above the envelope in the window (evaluation spikes), bytes
    envelope: tuple[float, ...]  # for the sparkline
    recent_points: int = 0  # envelope points in the recent half (recent_rises is out of recent_points - 1)
    latest_growth: float = 0.0  # rise of the envelope, unconfirmed buckets included, over its last LATEST_BUCKETS
    latest_span: float = 0.0  # seconds those buckets cover


# A new floor counts once it has held this many buckets: the envelope's last buckets are the minimum of only a
# few values (the end effect above), so they are left out of the slopes.
CONFIRM_BUCKETS = 2
# "Still growing" looks at the envelope's last this many buckets (3 min on the long window): the slopes describe
# the window and stay up for half of it after a stepwise warm-up stops; this part sees the stop within minutes.
LATEST_BUCKETS = 3


def measure(points: Sequence[tuple[float, float]], *, now: float, window: float, bucket: float) -> Trend | None:
    """Trend of ``(t, value)`` points over ``[now - window, now]``; None with fewer than 4 confirmed buckets."""
    pts = [(t, v) for t, v in points if now - window <= t <= now]
    if len(pts) < 2:
        return None
    stats = bucket_stats(pts, bucket)
    buckets = [(t, floor) for t, floor, _ in stats]
    if len(buckets) < 4 + CONFIRM_BUCKETS:
        return None
    full_env = lower_envelope(buckets)
    env = full_env[:-CONFIRM_BUCKETS]
    half_t = env[-1][0] - (env[-1][0] - env[0][0]) / 2
    recent = [p for p in env if p[0] >= half_t]
    return Trend(
        span=pts[-1][0] - pts[0][0],
        rate=theil_sen(env),
        recent_rate=theil_sen(recent) if len(recent) >= 2 else 0.0,
        growth=env[-1][1] - env[0][1],
        recent_growth=recent[-1][1] - recent[0][1],
        recent_rises=sum(1 for a, b in pairwise(recent) if b[1] > a[1]),
        noise=robust_noise(buckets),
        current=buckets[-1][1],
        latest=pts[-1][1],
        excursion=_excursion(stats, full_env),
        envelope=tuple(v for _, v in env),
        recent_points=len(recent),
        latest_growth=full_env[-1][1] - full_env[-1 - LATEST_BUCKETS][1],
        latest_span=full_env[-1][0] - full_env[-1 - LATEST_BUCKETS][0],
    )


def _excursion(stats: Sequence[tuple[float, float, float]], env: Sequence[tuple[float, float]]) -> float:
    """Highest bucket peak above the floor that follows it: an evaluation spike's height. Compared with the next
    bucket's envelope so that a steep rise inside one bucket (warm-up, a fast leak) is not taken for a spike."""
    n = len(env)
    return max(0.0, *(stats[i][2] - env[min(i + 1, n - 1)][1] for i in range(n)))


@dataclass(frozen=True, slots=True)
class Verdict:
    """``leak``: all of (a)-(d) hold; ``growing``: (a) still holds (hysteresis: keeps an active alert going)."""

    leak: bool
    growing: bool
    eta_seconds: float | None  # projected time until full at the recent rate, counting the peaks (spikes)
    eta_decision: float | None = None  # the same at the slower of the two slopes (what the decision used)


def assess(
    trend: Trend,
    *,
    min_span: float,
    min_rate: float,
    min_recent_ratio: float,
    min_recent_rises: int,
    noise_factor: float,
    free: float | None,
    horizon: float,
    min_growth: float,
    floor_growth: float = 0.0,
) -> Verdict:
    """Apply (a)-(d) to a trend. ``free``: bytes left before full (None: no projection, growth test only);
    ``min_growth``: growth over the window that is significant whatever the projection; ``floor_growth``: growth
    below which nothing is significant (a projection from a few MiB is guesswork)."""
    # Memory runs out when the floor plus its usual peak (an evaluation pass) reaches capacity, not the floor.
    headroom = None if free is None else max(0.0, free + (trend.latest - trend.current) - trend.excursion)

    def eta_at(rate: float) -> float | None:
        return headroom / rate if headroom is not None and rate > 0 else None

    # Reported at the recent rate (a leak that started mid-window is as fast as it is now); decided at the slower
    # of the two slopes, so a short burst of floor creep in the recent half cannot project an OOM on its own.
    eta = eta_at(trend.recent_rate)
    eta_decision = eta_at(min(trend.rate, trend.recent_rate))
    sustained = (
        trend.rate >= min_rate
        and trend.recent_rate >= min_rate
        and trend.recent_rate >= min_recent_ratio * trend.rate
    )
    growing = sustained and trend.growth > 0
    # The floor rose more than once lately (a warm-up that slows down rises once per half at most) and by more
    # than the noise: a noisy plateau's suffix minimum creeps up at the end by about one sigma.
    rose = (
        trend.growth > 0
        and trend.recent_rises >= min_recent_rises
        and trend.recent_growth >= noise_factor * trend.noise
    )
    # Still growing: the floor rose over the last few buckets at no less than min_recent_ratio of the window's
    # pace. A stepwise leak fails this between steps (its pending alert waits for the next step); a warm-up
    # that stopped fails it for good.
    still = trend.latest_growth >= min_recent_ratio * trend.rate * trend.latest_span
    enough = trend.span >= min_span
    significant = trend.growth >= floor_growth and (
        (eta_decision is not None and eta_decision <= horizon) or trend.growth >= min_growth
    )
    return Verdict(
        leak=sustained and rose and still and enough and significant,
        growing=growing,
        eta_seconds=eta,
        eta_decision=eta_decision,
    )
