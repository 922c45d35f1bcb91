"""Whether a rise decelerates towards a level the GPU has room for: the trend of its rate, and a saturation fit.

A caching allocator meeting new input shapes (dynamic shapes, bucketed sequence lengths, cuDNN autotuning) grows
in irregular steps, fast at first and then ever more slowly: over a minute or two its line is as clean and nearly
as straight as a fast leak's, and the quadratic fit's bend (``onset.fit``) is within the noise of 64-256 MiB steps.
What tells it apart is how its *rate* moves across the evidence: a concave rise whose recent rate is a small
fraction of its early rate is levelling off, and where it levels off can be projected. A leak goes on at its rate.

How: the span is cut in thirds; the first and last third's rates are the rise of the series' lower envelope
across them (floors of ``span / BUCKETS`` seconds, suffix minimum: spikes that return do not count) over their
length. When the last third's rate is under ``ratio`` of the first's, the rate is taken to decay exponentially
between the thirds' centres (the saturation fit: ``r(t) = r_end * exp(-(t - t_end) / tau)``, ``tau = (t_end -
t_start) / ln(r_start / r_end)``; exact for an exponential saturation), so the growth still to come is ``r_end *
tau``; the rise levels off when ``margin`` times that fits in the headroom left. A fast leak that began under a
warm-up keeps its rate in the last third, so the growth projected is large and does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.rules.leak.trend import bucket_floors, lower_envelope

# Floors per evidence span: 10 s at a 2 min span (two 5 s readings each), 20 s at 4 min.
BUCKETS = 12
# A rise whose rate decays towards a steady rate of at least this share of its last third's rate is a leak under a
# warm-up (the warm-up's part dies out, the leak's stays), not a warm-up levelling off.
STEADY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class RateTrend:
    """The rate of a span's rise over its first third and over its last third, and the growth still to come if the
    rate keeps decaying as it did between the two."""

    start: float  # bytes/s over the first third
    end: float  # bytes/s over the last third
    to_come: float  # bytes still to come from the last third's centre on (inf: the rate does not fall)
    steady: float = 0.0  # bytes/s the rate decays towards (rate = steady + w e^(-t/tau) through the three thirds)

    @property
    def ratio(self) -> float:
        return self.end / self.start if self.start > 0 else math.inf


def rate_trend(points: Sequence[tuple[float, float]], since: float, now: float) -> RateTrend | None:
    """The trend of the rate of ``points`` over ``[since, now]`` (None with fewer than ``BUCKETS`` - 2 floors, or no
    rise in its first third)."""
    span = now - since
    if span <= 0:
        return None
    env = lower_envelope(bucket_floors([p for p in points if since <= p[0] <= now], span / BUCKETS))
    if len(env) < BUCKETS - 2:
        return None
    third = len(env) // 3
    (t0, v0), (t1, v1) = env[0], env[third]
    (t2, v2), (t3, v3) = env[-1 - third], env[-1]
    if t1 <= t0 or t3 <= t2 or t2 <= t1:
        return None
    start, middle, end = (v1 - v0) / (t1 - t0), (v2 - v1) / (t2 - t1), (v3 - v2) / (t3 - t2)
    if start <= 0:
        return None
    if end >= start:
        return RateTrend(start, end, math.inf, end)
    # A leak under a warm-up: the rate decays towards the leak's, not to 0. Through the three thirds' rates,
    # rate = steady + w q^k (k = 0, 1, 2) gives steady = (r0 r2 - r1²) / (r0 + r2 - 2 r1); a rate falling as fast
    # or faster than a line (r0 + r2 <= 2 r1: a warm-up reaching its level in a finite time) decays to 0.
    convexity = start + end - 2 * middle
    steady = max(0.0, (start * end - middle * middle) / convexity) if convexity > 0 else 0.0
    if end <= 0:
        return RateTrend(start, end, 0.0, steady)
    # The saturation fit: the rate decaying exponentially from the first third's centre to the last third's, and on.
    tau = ((t2 + t3) / 2 - (t0 + t1) / 2) / math.log(start / end)
    return RateTrend(start, end, end * tau, steady)


def levels_off(points: Sequence[tuple[float, float]], since: float, now: float, *, headroom: float, ratio: float,
               margin: float) -> bool:
    """The rise over ``[since, now]`` decelerates (its rate now under ``ratio`` of its rate at ``since``) and,
    followed as its rate falls, levels off with room: ``margin`` times the growth still to come is under
    ``headroom`` (bytes left before full)."""
    rt = rate_trend(points, since, now)
    return (rt is not None and rt.ratio < ratio and margin * rt.to_come < headroom
            and rt.steady < STEADY_SHARE * rt.end)
