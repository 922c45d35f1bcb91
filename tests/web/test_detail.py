"""The pure parts of the status page's additions to /api/v1/status: thinning, the rate, the recent window."""

from __future__ import annotations

from gpuwatchd.store import ProcessPoint
from gpuwatchd.web.detail import _recent, _slope, _thin


def test_thin_keeps_the_newest_and_at_most_n() -> None:
    pts = [(float(t), float(t * 10)) for t in range(1000)]
    out = _thin(pts, 90)
    assert len(out) == 90 and out[-1] == [999.0, 9990] and out[0] == [0.0, 0]
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert _thin(pts[:3], 90) == [[0.0, 0], [1.0, 10], [2.0, 20]]


def test_slope_is_bytes_per_second_and_none_without_evidence() -> None:
    assert _slope([(t, 5.0 + 2.0 * t) for t in (0.0, 1.0, 2.0, 5.0)]) == 2.0
    assert _slope([(0.0, 1.0), (1.0, 2.0)]) is None  # two points are no trend
    assert _slope([(3.0, 1.0)] * 4) is None  # no time span


def test_recent_reads_back_from_the_newest() -> None:
    pts = [ProcessPoint(float(t), t * 100 if t != 8 else None, None) for t in range(10)]
    assert _recent(pts, 6.5) == [(7.0, 700.0), (9.0, 900.0)]
    assert _recent(pts, 100.0) == [] and _recent((), 0.0) == []
