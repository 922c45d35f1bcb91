"""Regular staircases: steps of a steady size at a steady period, still coming, are found (also after a warm-up
that overlapped their start); irregular, shrinking, stopped or returning steps are not."""

from __future__ import annotations

import math
import random
from itertools import pairwise

from gpuwatchd.rules.leak.steps import MIN_STEPS, decelerating, spreading, staircase

MIB = 1024**2
GIB = 1024**3


def series(f: object, seconds: float, start: float = 0.0) -> list[tuple[float, float]]:
    return [(float(s), float(f(s))) for s in range(int(start), int(seconds) + 1, 5)]  # type: ignore[operator]


def warm(s: float, level: float) -> float:
    return level * (1 - math.exp(-3 * s / 120))


def test_fast_staircase_is_found_with_its_size_period_and_rate() -> None:
    pts = series(lambda s: 4 * GIB + (s // 30) * GIB, 240)
    st = staircase(pts, 240.0)
    assert st is not None and st.steps >= MIN_STEPS
    assert st.period == 30.0 and st.size == GIB
    assert st.rate == GIB / 30


def test_staircase_starting_under_a_warm_up_is_found_once_enough_steps_stand_clear_of_it() -> None:
    pts = series(lambda s: warm(s, 5 * GIB) + (s // 30) * GIB, 210)
    st = staircase(pts, 210.0)
    assert st is not None and st.period == 30.0 and abs(st.size - GIB) < 0.1 * GIB


def test_steps_over_a_warm_up_tail_dying_out_count_as_soon_as_the_tail_shrinks_at_every_step() -> None:
    # A 2 GiB/min leak in 1 GiB steps from a job's first second, under a 7 GiB warm-up (bench/detect.py
    # leak-staircase-2048-s4): between its steps at 60, 90, 120 and 150 s the warm-up's tail adds ~0.74, 0.35 and
    # 0.17 GiB, more than a quarter step at first. A tail that shrinks at every step down to under a quarter step
    # is a warm-up dying out, not a smooth rise between catch-up jumps: the run counts at 150 s, not 210 s.
    pts = series(lambda s: warm(s, 7 * GIB) + (s // 30) * GIB, 150)
    st = staircase(pts, 150.0)
    assert st is not None and st.steps == MIN_STEPS and st.period == 30.0 and st.last == 150.0
    # A creep that does not shrink at every step is not that (a smooth rise between catch-up jumps): no run.
    creeps = [0.6 * GIB, 0.3 * GIB, 0.35 * GIB, 0.2 * GIB, 0.2 * GIB, 0.2 * GIB]

    def creeping(s: float) -> float:
        k = int(s // 30)
        return 4 * GIB + k * GIB + sum(creeps[:k]) + creeps[k] * (s % 30) / 30

    assert staircase(series(creeping, 150), 150.0) is None


def test_steps_every_other_reading_are_a_ramp_not_a_staircase() -> None:
    # ~230 MiB every 10 s (an allocator warm-up meeting a new shape every 6-14 s, issue 22): at 5 s readings
    # every interval is 10 +- 5 s, so a run of them says nothing about regularity; 20 s steps still count.
    assert staircase(series(lambda s: 4 * GIB + (s // 10) * 230 * MIB, 200), 200.0) is None
    st = staircase(series(lambda s: 4 * GIB + (s // 20) * GIB, 200), 200.0)
    assert st is not None and st.period == 20.0


def test_fewer_than_min_steps_is_no_staircase() -> None:
    pts = series(lambda s: 4 * GIB + min(MIN_STEPS - 1, s // 60) * GIB, 400)
    assert staircase(pts, 230.0) is None


def test_irregular_warm_up_steps_are_no_staircase() -> None:
    rng = random.Random(3)
    times = sorted(rng.uniform(0, 600) for _ in range(7))
    sizes = [rng.uniform(0.25, 1.0) * GIB for _ in times]
    pts = series(lambda s: 2 * GIB + sum(z for x, z in zip(times, sizes, strict=True) if s >= x), 600)
    assert staircase(pts, 600.0) is None


def test_shrinking_steps_of_a_saturating_job_are_no_staircase() -> None:
    pts = series(lambda s: 4 * GIB + sum(GIB * 0.7**i for i in range(int(s // 60))), 600)
    assert staircase(pts, 600.0) is None


def test_a_staircase_that_stopped_is_no_longer_one() -> None:
    def f(s: float) -> float:
        return 4 * GIB + min(s // 30, 8) * GIB

    assert staircase(series(f, 260), 260.0) is not None
    assert staircase(series(f, 400), 400.0) is None  # last step at 240 s, 5 periods ago


def test_spikes_that_return_make_no_steps() -> None:
    def f(s: float) -> float:
        return 6 * GIB + (GIB if s % 60 < 10 else 0.0)

    assert staircase(series(f, 600), 600.0) is None


def test_a_smooth_rise_broken_into_chunks_by_a_stalling_poller_is_no_staircase() -> None:
    # Flat while the poller stalls, a catch-up jump, then the smooth rise again: jumps at a steady pace, but the
    # series creeps between them, which a staircase does not.
    pts = [(float(s), 4 * GIB + 12 * MIB * (s - s % 20 if s % 20 < 10 else s)) for s in range(0, 400, 5)]
    assert staircase(pts, 395.0) is None


def test_a_rise_over_many_readings_is_a_ramp_not_a_step() -> None:
    def f(s: float) -> float:  # 1 GiB every 60 s, each spread over 20 s of readings
        return 4 * GIB + (s // 60) * GIB + min(1.0, (s % 60) / 20) * GIB

    assert staircase(series(f, 600), 600.0) is None


def test_steps_whose_intervals_keep_growing_are_spreading_not_a_staircase() -> None:
    # An allocator meeting ever rarer new input shapes: ~170 MiB steps, each gap 8 % longer than the one before.
    times, gap, t = [], 20.0, 0.0
    while t < 600:
        t += gap
        times.append(t)
        gap *= 1.08
    pts = series(lambda s: 2 * GIB + sum(170 * MIB for x in times if s >= x), times[8] + 5)
    assert spreading(pts)
    assert staircase(pts, times[8] + 5) is None


def test_a_leak_stepping_at_its_own_pace_is_not_spreading() -> None:
    # A period the 5 s poll does not divide: the gaps read 35 or 40 s, but they do not grow.
    pts = series(lambda s: warm(s, 4 * GIB) + (s // 37) * 200 * MIB, 400)
    assert not spreading(pts)
    assert staircase(pts, 400.0) is not None
    assert not decelerating([(t, GIB, 0.0) for t in (0.0, 35.0, 75.0, 110.0, 150.0, 185.0)])


def test_a_leak_read_through_a_poller_stalling_ever_longer_is_not_spreading() -> None:
    # A steady leak whose readings come ever more rarely (a loaded host): the steps grow with the intervals.
    reads, gap, t = [0.0], 20.0, 0.0
    while t < 600:
        t += gap
        reads.append(t)
        gap *= 1.08
    rate = 8 * MIB  # per second
    pts = [(s, 2 * GIB + rate * max(x for x in reads if x <= s)) for s in range(0, int(reads[8]) + 6, 5)]
    assert not spreading(pts)
    assert not decelerating([(x, rate * (x - a), 0.0) for a, x in pairwise(reads[:9])])
