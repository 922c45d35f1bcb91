"""Regular staircases: growth in steps of about the same size at about the same period, that never come back.

Why: a staircase leak (a cache that adds an entry per epoch, per N iterations, per new sequence length) rises in
jumps with flat stretches between them, so a line through it is rough (its growth is few times its scatter) and
the leak rule used to wait for the long window before trusting it; a fast one (1-3 GiB/min in 1 GiB steps) then
fired with well under half of its time to full left. What tells it from the allocator warm-up that also steps
(first evaluation pass, first checkpoint, new shapes) is the steps themselves: a leak's keep coming at a steady
period with a steady size, while a warm-up's come at irregular times with irregular sizes and stop, and a
saturating job's shrink or spread out. So a run of ``MIN_STEPS`` or more steps, each within ``TOLERANCE`` of
the run's median size and period and the last one no more than ``LATE_PERIODS`` periods ago, is evidence of a
leak as good as a clean straight rise (gpuwatchd/rules/leak/__init__.py, ``_urgent``), once one more step confirms it.

The series is read as its suffix minimum (``lower_envelope``): a spike that returns leaves no step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

from gpuwatchd.rules.leak.trend import lower_envelope, theil_sen

MIB = float(1024**2)
# No rise between two readings smaller than this is a step (noise, the allocator's 2 MiB rounding).
MIN_STEP = 8 * MIB
# Fewest steps of a regular run: three intervals. A run this short is only a candidate: the leak rule takes it as
# evidence for one hold, and the next step on schedule (MIN_STEPS + 1) must confirm it (rules/leak/__init__.py);
# a warm-up of four steps at a steady pace by chance then never fires.
MIN_STEPS = 4
# A run stepping more often than every MIN_PERIOD_SAMPLES readings is a ramp, not a staircase: its intervals are
# known to a reading either way, so "regular" means nothing (each within a reading of 10 s is anything from 5 to
# 15 s), and at that pace a step is most of the readings' rises. An allocator warm-up meeting a new input shape
# every 6-14 s (issue 22, bench/detect.py shape-warmup-regular-*-s7: ~230 MiB steps, levelling off ~5 GiB up
# within 4 min) passed as a regular staircase and fired at 210 s; a ramp is judged by its line (straight, clean).
# The corpus's fastest staircase leaks step every 20 s (1 GiB at 3 GiB/min).
MIN_PERIOD_SAMPLES = 3
# Each step's size and each interval must lie within this share of the run's median.
TOLERANCE = 0.25
# A step is a rise of at least this share of the typical big rise of the series ...
STEP_SHARE = 0.3
# ... over at most this many readings (a poll can fall mid-step); a longer rise is a ramp.
MAX_STEP_READINGS = 2
# Between two steps the series stays flat: what it creeps up by must stay under this share of a step. A smooth
# rise broken into chunks by a loaded poller's stalls (flat, then a catch-up jump) creeps between its "steps".
MAX_CREEP = 0.25
# ... or it creeps by less at every step, each creep under this share of the one before (a warm-up's tail dying
# out under a leak's steps: its exponential halves in well under a leak step's period of 20-60 s).
CREEP_DECAY = 0.75
# A run whose last step is under this share of its first is shrinking: a saturating job, not a leak.
SHRINK = 0.8
# The run is current only while the next step is due: no step for this many periods and it has stopped.
LATE_PERIODS = 1.5
# A run whose intervals keep growing (their Theil-Sen trend, over the run, adds more than one sample and this
# share of the period) is decelerating: an allocator meeting ever rarer new shapes, not a leak, whose steps come
# at its own steady pace.
SPREAD = 0.1
# ... and the rate of its steps (size over interval) falls by more than this share over the run.
RATE_DROP = 0.2
# Fewest steps of a spreading run: with fewer, a leak read through a loaded poller (stalls of 5-20 s and more)
# shows intervals and rates that drift by chance.
SPREAD_STEPS = 2 * MIN_STEPS


@dataclass(frozen=True, slots=True)
class Staircase:
    """A regular run of steps at the end of a series."""

    steps: int
    size: float  # median step, bytes
    period: float  # median interval, seconds
    last: float  # time of the last step

    @property
    def rate(self) -> float:
        return self.size / self.period


def _steps(points: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(time, size, creep before it) of each step of the envelope: a rise between two readings of at least
    ``STEP_SHARE`` of the typical big rise (the median of the ``MIN_STEPS`` largest), so a warm-up's creep
    between a fast leak's steps is not taken for steps of its own. A step spread over two consecutive readings
    counts once; a rise over more readings is a ramp, not a step (size 0: it breaks any run), and the sub-step
    rises between two steps are their creep."""
    env = lower_envelope(points)
    diffs = [(t, b - a) for (_, a), (t, b) in pairwise(env)]
    if len(diffs) < MIN_STEPS:
        return []
    threshold = max(MIN_STEP, STEP_SHARE * median(sorted(d for _, d in diffs)[-MIN_STEPS:]))
    steps: list[tuple[float, float, float]] = []
    creep = 0.0
    readings = 0
    for t, d in diffs:
        if d < threshold:
            creep += max(0.0, d)
            readings = 0
            continue
        readings += 1
        if readings == 1:
            steps.append((t, d, creep))
            creep = 0.0
        else:
            st, size, before = steps[-1]
            steps[-1] = (st, size + d if readings <= MAX_STEP_READINGS else 0.0, before)
    return steps


def _flat_between(run: Sequence[tuple[float, float, float]], size: float) -> bool:
    """Between the run's steps the series creeps by under ``MAX_CREEP`` of a step, or by less at every step down
    to that (each creep under ``CREEP_DECAY`` of the one before): a leak stepping from the job's start under its
    allocator warm-up, whose tail dies out between the steps. A smooth rise read through a stalling poller creeps
    between its catch-up jumps by as much as its fresh stretch lasted, at random."""
    creeps = [c for _, _, c in run[1:]]
    if all(c <= MAX_CREEP * size for c in creeps):
        return True
    return creeps[-1] <= MAX_CREEP * size and all(b <= CREEP_DECAY * a for a, b in pairwise(creeps))


def _near(x: float, mid: float, slack: float = 0.0) -> bool:
    return abs(x - mid) <= TOLERANCE * mid + slack


def staircase(points: Sequence[tuple[float, float]], now: float, *, sample: float = 5.0) -> Staircase | None:
    """The regular run of steps ending the series, when there is one that is still stepping at ``now``.
    ``sample``: the series' spacing (a step's time is known to within it)."""
    steps = _steps(points)
    if len(steps) < MIN_STEPS:
        return None
    # Grow the run backwards from the last step while sizes and intervals stay consistent with it.
    best: Staircase | None = None
    for first in range(len(steps) - MIN_STEPS, -1, -1):
        run = steps[first:]
        sizes = [s for _, s, _ in run]
        gaps = [b[0] - a[0] for a, b in pairwise(run)]
        size, period = median(sizes), median(gaps)
        if min(sizes) <= 0 or not (all(_near(s, size) for s in sizes) and all(_near(g, period, sample) for g in gaps)):
            break
        if not _flat_between(run, size) or sizes[-1] < SHRINK * sizes[0]:
            break
        best = Staircase(len(run), size, period, run[-1][0])
    if best is None or now - best.last > LATE_PERIODS * best.period + sample:
        return None
    if best.period < MIN_PERIOD_SAMPLES * sample:
        return None
    if decelerating(steps[-best.steps:], sample=sample):
        return None
    return best


def decelerating(run: Sequence[tuple[float, float, float]], *, sample: float = 5.0) -> bool:
    """The run's intervals keep growing while its steps do not: over the run the intervals' trend (Theil-Sen, per
    step) adds more than one ``sample`` plus ``SPREAD`` of the median interval, and the rate of each step (its
    size over the interval before it) falls by more than ``RATE_DROP``. A leak's steps keep their period (to within
    a sample: the poll falls anywhere in the step), or, read through a poller that stalls longer and longer, grow
    with the intervals (its rate holds); a warm-up whose new shapes come ever rarer spreads even steps out."""
    gaps = [b[0] - a[0] for a, b in pairwise(run)]
    if len(gaps) < 3:
        return False
    if theil_sen(list(enumerate(gaps))) * (len(gaps) - 1) <= sample + SPREAD * median(gaps):
        return False
    rates = [(i, b[1] / g) for i, ((a, b), g) in enumerate(zip(pairwise(run), gaps, strict=True))]
    return -theil_sen(rates) * (len(rates) - 1) > RATE_DROP * median(r for _, r in rates)


def spreading(points: Sequence[tuple[float, float]], *, sample: float = 5.0) -> bool:
    """The series ends in a staircase of ``SPREAD_STEPS`` or more steps of about one size (within ``TOLERANCE``
    of their median, flat between them) whose intervals keep growing (``decelerating``), however irregular they
    are: an allocator meeting ever rarer new input shapes, which levels off. A line through it can look clean
    and straight for minutes; a leak's steps do not spread out."""
    steps = _steps(points)
    run: list[tuple[float, float, float]] = []
    for first in range(len(steps) - 1, -1, -1):
        cand = steps[first:]
        sizes = [s for _, s, _ in cand]
        size = median(sizes)
        if min(sizes) <= 0 or not all(_near(s, size) for s in sizes):
            break
        if any(c > MAX_CREEP * size for _, _, c in cand[1:]):
            break
        run = cand
    return len(run) >= SPREAD_STEPS and decelerating(run, sample=sample)
