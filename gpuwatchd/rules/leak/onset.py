"""Where a memory series' current growth began (its onset), and how well a line describes it since.

Why an onset: a leak that starts after a long plateau is diluted in a fixed window (its slope, hence its rate and
time to full, lag for many minutes), and how soon growth could be trusted depended on how long the daemon had
watched the flat series before. Judging the series from its onset makes a late leak look like a fresh one.

How: the series' lower envelope (one floor per ``ONSET_BUCKET``, suffix minimum: spikes that return vanish) is
split where two straight lines fit it best (least squares, O(n) with prefix sums). The split counts as the onset
only if it is where growth *began or sped up* (the line after it rises at least ``SPEEDUP`` times faster than the
line before it): a series that slows down (a warm-up, a saturating job) keeps its start, so the slowing stays in
the judged window. A flat line before the onset means the start of the growth was seen (``Onset.seen``); a
series that was already rising when the daemon first saw it was not, and is judged more cautiously
(docs/alerts.md, "Seen from its start").

``fit`` measures the evidence since the onset: residual scatter around the least-squares line (its quality) and
the slope at the end of a quadratic fit over the slope at its start (its straightness: a saturating curve
flattens, a leak does not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.rules.leak.trend import bucket_floors, lower_envelope

GIB = float(1024**3)
MIB = float(1024**2)
# Floors per 30 s: fine enough for a fast leak's few minutes, and 120 points for an hour of history.
ONSET_BUCKET = 30.0
# The line after a split must rise this many times faster than the one before it for the split to be an onset.
SPEEDUP = 3.0
# Below this, a line is flat (bytes/s; 1 MiB/min is the rule's default minimum leak rate).
FLAT_RATE = MIB / 60
# A split must explain the envelope better than one line by more than this scatter per point (the allocator
# rounds to 2 MiB pages; differences below that are rounding, not a change).
MIN_GAIN_SIGMA = 2 * MIB
# Repeated splits: a plateau, a step kept from an evaluation pass, another plateau, then the leak.
MAX_SPLITS = 3


@dataclass(frozen=True, slots=True)
class Onset:
    """When the series' current growth began, and whether a flat stretch before it was seen."""

    t: float
    seen: bool
    # When the split at ``t`` is where a seen start's warm-up stopped slowing (a settling split), the split before
    # it: the leak may have begun anywhere in between, under the warm-up's tail (see ``candidates``).
    earliest: float | None = None


class _Sums:
    """Prefix sums of x, y, x², xy, y² for O(1) least-squares lines over any index range."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.s = [(0.0, 0.0, 0.0, 0.0, 0.0)]
        a = b = c = d = e = 0.0
        for x, y in zip(xs, ys, strict=True):
            a, b, c, d, e = a + x, b + y, c + x * x, d + x * y, e + y * y
            self.s.append((a, b, c, d, e))

    def line(self, i: int, j: int) -> tuple[float, float]:
        """(slope, sse) of the least-squares line over points i..j-1."""
        n = j - i
        sx, sy, sxx, sxy, syy = (hi - lo for hi, lo in zip(self.s[j], self.s[i], strict=True))
        vxx = sxx - sx * sx / n
        vxy = sxy - sx * sy / n
        vyy = syy - sy * sy / n
        if vxx <= 0:
            return 0.0, max(0.0, vyy)
        return vxy / vxx, max(0.0, vyy - vxy * vxy / vxx)


def envelope(points: Sequence[tuple[float, float]], bucket: float = ONSET_BUCKET) -> list[tuple[float, float]]:
    return lower_envelope(bucket_floors(points, bucket))


def find_onset(
    points: Sequence[tuple[float, float]], *, settle: float | None = None, bucket: float = ONSET_BUCKET
) -> Onset | None:
    """The onset of the growth at the end of ``points`` (None without points). A split at or before ``settle``
    counts even where growth slows: a process seen from its start settles its caching allocator first (warm-up),
    and that rise is not part of a leak that follows it."""
    if not points:
        return None
    env = envelope(points, bucket)
    n = len(env)
    if n < 8:
        return Onset(points[0][0], False)
    t0, v0 = env[0]
    # Minutes and GiB: keeps the sums of squares far from float64's precision limits.
    xs = [(t - t0) / 60 for t, _ in env]
    ys = [(v - v0) / GIB for _, v in env]
    sums = _Sums(xs, ys)
    gain_floor = (MIN_GAIN_SIGMA / GIB) ** 2
    flat_rate = FLAT_RATE * 60 / GIB
    start, seen, earliest = 0, False, None
    for _ in range(MAX_SPLITS):
        hi = n
        _, whole = sums.line(start, hi)
        best: tuple[float, int, float, float] | None = None
        for k in range(start + 3, hi - 3):
            left_slope, left = sums.line(start, k)
            right_slope, right = sums.line(k, hi)
            cost = left + right
            if best is None or cost < best[0]:
                best = (cost, k, left_slope, right_slope)
        if best is None:
            break
        cost, k, left_slope, right_slope = best
        if whole - cost <= (hi - start) * gain_floor or right_slope <= 0:
            break
        flat = left_slope <= flat_rate
        settling = settle is not None and env[k][0] <= settle
        speedup = right_slope >= SPEEDUP * left_slope
        if not flat and not settling and not speedup:
            break
        earliest = None if flat or speedup else env[start][0]
        start, seen = k, seen or flat
    return Onset(env[start][0], seen, earliest)


def candidates(on: Onset, now: float, min_span: float, step: float = 5.0, bucket: float = ONSET_BUCKET) -> list[float]:
    """Onsets to judge a series from, earliest first: ``on.t``, preceded, after a settling split, by the times
    between the split before it and ``on.t`` that already hold ``min_span`` of evidence at ``now``.

    Why: a leak that begins while the warm-up still settles (a fresh job) shows up as one more slowing of the
    warm-up, so the split lands after the warm-up's tail, tens of seconds after the leak began; the first of
    these onsets whose rise since is straight and clean (the tail has died out) is judged as soon as it holds
    the evidence, as a leak after a flat plateau is (bench/detect.py, late_onset_extra_s)."""
    if on.earliest is None or now - on.t >= min_span:
        return [on.t]
    out: list[float] = []
    t = max(on.earliest, on.t - bucket)
    while t < on.t and now - t >= min_span:
        out.append(t)
        t += step
    return [*out, on.t]


@dataclass(frozen=True, slots=True)
class Fit:
    """The evidence since an onset: how straight and how clean the envelope's rise is."""

    span: float  # seconds of envelope since the onset
    rate: float  # least-squares slope, bytes/s
    scatter: float  # RMS residual around that line, bytes
    straightness: float  # quadratic fit's slope at the end / slope at the start (1: a line; < 1: flattening)
    # Growth still to come, bytes, if the envelope follows its quadratic fit to that parabola's peak (where a
    # flattening rise levels off); inf when the fit does not flatten.
    peak_growth: float = math.inf


def fit(points: Sequence[tuple[float, float]], onset: float, *, bucket: float = ONSET_BUCKET) -> Fit | None:
    """Line and quadratic fits of the envelope from ``onset`` on (None with fewer than 6 floors)."""
    env = [(t, v) for t, v in envelope([p for p in points if p[0] >= onset], bucket)]
    # The last floors are a minimum over few values (they creep up on a noisy plateau): left out, as in trend.py.
    env = env[:-2]
    if len(env) < 6:
        return None
    t0, v0 = env[0]
    span = env[-1][0] - t0
    if span <= 0:
        return None
    xs = [(t - t0) / span for t, _ in env]
    ys = [(v - v0) / GIB for _, v in env]
    slope, sse = _Sums(xs, ys).line(0, len(xs))
    b, c = _quadratic(xs, ys)
    straight = (b + 2 * c) / b if b > 0 else 0.0
    end_slope = b + 2 * c
    peak = math.inf if c >= 0 else max(0.0, end_slope) ** 2 / (-4 * c) * GIB
    return Fit(span, slope * GIB / span, (sse / len(xs)) ** 0.5 * GIB, straight, peak)


def _quadratic(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(b, c) of the least-squares y = a + b x + c x² (normal equations, Cramer's rule)."""
    n = float(len(xs))
    s1 = sum(xs)
    s2 = sum(x * x for x in xs)
    s3 = sum(x**3 for x in xs)
    s4 = sum(x**4 for x in xs)
    t0 = sum(ys)
    t1 = sum(x * y for x, y in zip(xs, ys, strict=True))
    t2 = sum(x * x * y for x, y in zip(xs, ys, strict=True))

    def det(m: tuple[tuple[float, float, float], ...]) -> float:
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
                - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))

    d = det(((n, s1, s2), (s1, s2, s3), (s2, s3, s4)))
    if abs(d) < 1e-12:
        return 0.0, 0.0
    b = det(((n, t0, s2), (s1, t1, s3), (s2, t2, s4))) / d
    c = det(((n, s1, t0), (s1, s2, t1), (s2, s3, t2))) / d
    return b, c
