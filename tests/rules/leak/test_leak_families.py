"""The generated families of bench/leak_families.py (issue 29) through the real Store, RulesEngine and leak rule, as
bench/detect.py runs them: a few traces per family, from the tuning seeds and from the held-back seeds (which the
detector was never tuned on). No warm-up fires, of any kind; every leak fires for its kind in time (a fast one
before 30 % of its time to full has passed, a slow one with at least 30 % of it left)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import detect  # noqa: E402  (bench/detect.py: the simulation loop)
import leak_families  # noqa: E402

SEEDS = [*leak_families.TUNING_SEEDS[:2], *leak_families.HELD_BACK_SEEDS[:2]]


# Held-back traces the detector still gets wrong (docs/alerts.md, "Generated families"): known, not tuned away.
# Strict: one that starts passing fails here, so the list is kept true.
KNOWN = {
    ("dynshape", 9001): "a warm-up whose rise stays straight past a third of the time a leak that fast would take to "
                        "fill the GPU (the limit of the rate's trend)",
    ("mixed", 9001): "the same warm-up under evaluation passes and checkpoints",
    ("leak-slow", 9000): "a slow staircase leak under evaluation spikes on a GPU nearly full of other processes' "
                         "memory: fired with 1 % of its time left, before issue 29 as now",
}


def _cases(families: tuple[str, ...]) -> list[object]:
    return [pytest.param(f, s, id=f"{f}-{s}",
                         marks=[pytest.mark.xfail(reason=KNOWN[f, s], strict=True)] if (f, s) in KNOWN else [])
            for f in families for s in SEEDS]


@pytest.mark.parametrize(("family", "seed"), _cases(leak_families.WARMUPS))
def test_no_warm_up_family_fires(family: str, seed: int) -> None:
    case = leak_families.warmup_case(family, seed)
    o = detect.simulate(case)
    assert o.fired_at is None, f"{case.name} fired at {o.fired_at:.0f}s"


@pytest.mark.parametrize(("family", "seed"), _cases(leak_families.LEAKS))
def test_every_leak_family_fires_in_time(family: str, seed: int) -> None:
    case = leak_families.leak_case(family, seed)
    assert case.leak_start is not None
    o = detect.simulate(case)
    assert o.full_at is not None, case.name  # every generated leak fills its GPU within days
    to_full = o.full_at - case.leak_start
    left = 0.0 if o.fired_at is None else (o.full_at - o.fired_at) / to_full
    need = 1 - detect.FAST_PASSED_SHARE if case.rate_mib >= leak_families.FAST_RATE_MIB else detect.SLOW_LEFT_SHARE
    assert left >= need, f"{case.name}: {left:.2f} of its time to full left, needs {need:.2f}"


def test_the_families_draw_their_shapes_from_the_written_ranges() -> None:
    # Two seeds give two shapes; one seed gives the same trace twice (the bench's figures are reproducible).
    a, b = leak_families.warmup_case("dynshape", 0), leak_families.warmup_case("dynshape", 1)
    again = leak_families.warmup_case("dynshape", 0)
    readings = [[c.series(float(s))[1] for s in range(0, 600, 5)] for c in (a, b)]
    assert readings[0] != readings[1]
    assert (a.total, a.observe_from, a.restart_at) == (again.total, again.observe_from, again.restart_at)
    assert set(leak_families.TUNING_SEEDS).isdisjoint(leak_families.HELD_BACK_SEEDS)
    # The class: a concave rise of 3-6 GiB within 1-3 min in 64-256 MiB steps, then a slow tail.
    gib = leak_families.GIB
    for seed in leak_families.TUNING_SEEDS[:5]:
        c = leak_families.warmup_case("dynshape", seed)
        at = [c.series(float(s))[1] for s in (30, 240, 2700)]
        assert 2.5 * gib <= at[1] - at[0] <= 6.5 * gib + 2 * 128 * 1024**2
        assert at[2] - at[1] <= 1.5 * gib + 256 * 1024**2
