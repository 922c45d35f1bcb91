"""Onset of a memory series' growth: found after a plateau and after a warm-up, not inside a slowing curve; the
fit since the onset tells a straight rise from a flattening one."""

from __future__ import annotations

import math

from gpuwatchd.rules.leak.onset import find_onset, fit

MIB = 1024**2
GIB = 1024**3


def series(f: object, minutes: float) -> list[tuple[float, float]]:
    return [(s, float(f(s))) for s in range(0, int(minutes * 60), 5)]  # type: ignore[operator]


def test_onset_after_a_long_plateau_is_where_the_leak_began_and_was_seen() -> None:
    pts = series(lambda s: 6 * GIB + 64 * MIB / 60 * max(0, s - 1800), 40)
    on = find_onset(pts)
    assert on is not None and on.seen and abs(on.t - 1800) <= 60


def test_warm_up_is_skipped_only_for_a_process_seen_starting() -> None:
    def f(s: float) -> float:
        return 5 * GIB * (1 - math.exp(-3 * s / 120)) + 128 * MIB / 60 * s

    pts = series(f, 12)
    started = find_onset(pts, settle=300.0)
    assert started is not None and 60 <= started.t <= 300
    unknown = find_onset(pts)  # a slowing split is no onset without a seen start
    assert unknown is not None and unknown.t < 30 and not unknown.seen  # the first floor's time


def test_saturating_curve_has_no_onset_inside_and_fits_as_flattening() -> None:
    pts = series(lambda s: 4 * GIB + 4 * GIB * (1 - math.exp(-s / 300)), 15)
    on = find_onset(pts)
    assert on is not None and on.t < 30 and not on.seen
    f = fit(pts, 0.0)
    assert f is not None and f.straightness < 0.5


def test_straight_leak_fits_straight_and_clean() -> None:
    pts = series(lambda s: 4 * GIB + 48 * MIB / 60 * s, 6)
    f = fit(pts, 0.0)
    assert f is not None and f.straightness > 0.95
    assert abs(f.rate - 48 * MIB / 60) / (48 * MIB / 60) < 0.05
    assert f.scatter < 2 * MIB
