"""The seeded corpus of GPU memory timelines that bench/detect.py feeds to the leak rule (24 GiB GPU, 5 s steps).

Leaks (each must fire, for the right kind, before the memory is full):
- rates 16/48/128/384 MiB/min (slow: hours to full) and 1/2/3 GiB/min (fast: minutes; 3 GiB/min is the issue's
  50 MiB/s) x shapes linear, staircase (+x every 4-8 min, at most 1 GiB a step), noisy (Gaussian), hidden under
  periodic evaluation spikes; each after a caching-allocator warm-up, from the job's start or after 5 or 15 min;
- late onset: the same linear leak right after the job's warm-up on a GPU the daemon just began to watch
  ("fresh", 3 min in) and after 30-40 min of plateau ("late");
- unattributed growth (memory no process accounts for) after a plateau;
- a leak during which the daemon restarts.
Non-leaks (none may fire, of any kind): plateau, evaluation spikes with ``empty_cache`` (memory returns) and
without (the pool keeps the first spike's memory), checkpoint spikes, stepwise warm-up, long warm-up, job
restart (new pid), a level flipping between two values (like the real csv04 capture), a DataLoader whose host
RSS levels off, a saturating dynamic-shapes job (new shapes grow the pool ever more slowly), the same warm-up as
the allocator sees it (64-256 MiB steps, fast then ever rarer, levelling off 4-6 GiB up within minutes), and a
saturating job read by a stalling poller (flat for 5-20 s, then a jump: a busy host). Every non-leak
is observed from its start, from 5 s in, from a random phase (the daemon started while the job ran), and with a
daemon restart in the middle.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

MIB = 1024**2
GIB = 1024**3
Series = Callable[[float], tuple[int, float]]  # seconds since the job started -> (pid, GPU bytes)
RssSeries = Callable[[float], float]  # seconds since start -> host RSS bytes of the same process
Extra = Callable[[float], float]  # seconds since start -> GPU bytes no process accounts for (beyond the driver's)

SLOW_RATES_MIB = (16.0, 48.0, 128.0, 384.0)
FAST_RATES_MIB = (1024.0, 2048.0, 3072.0)
# Largest step of a staircase leak: a cache that never evicts adds an entry per step (a batch's activations, a
# sequence length); a fast staircase steps often rather than in quarter-GPU jumps.
MAX_STEP_BYTES = 1 * GIB


@dataclass(frozen=True)
class Case:
    name: str
    series: Series
    leak_start: float | None  # None: not a leak
    rate_mib: float = 0.0
    kind: str = "gpu"  # the GpuMemoryLeak kind a leak must fire as
    rss: RssSeries | None = None
    extra: Extra | None = None
    observe_from: float = 0.0  # the daemon starts watching this many seconds into the job
    restart_at: float | None = None  # the daemon restarts (history kept in its state dir) at this second
    pair: str | None = None  # late-onset pairs: ("fresh"|"late") + key
    total: int = 24 * GIB  # the GPU's memory
    minutes: float = 100.0  # how long the job is simulated (a leak's ground truth runs on until it is full)
    family: str = ""  # bench/leak_families.py: the generated family it was drawn from


def warm(s: float, level: float, over: float = 120.0) -> float:
    return level * (1 - math.exp(-3 * max(0.0, s) / over))


def _shapes(seed: int, rate_mib: float, base: float, start: float, rng: random.Random) -> list[tuple[str, Series]]:
    rate = rate_mib * MIB / 60
    period = min(rng.uniform(240, 480), MAX_STEP_BYTES / rate)
    noise = rng.uniform(20, 80) * MIB
    r = random.Random(seed * 1000 + int(rate_mib))

    def grow(s: float) -> float:
        return rate * max(0.0, s - start)

    def linear(s: float) -> tuple[int, float]:
        return 4242, warm(s, base) + grow(s)

    def staircase(s: float) -> tuple[int, float]:
        return 4242, warm(s, base) + (max(0.0, s - start) // period) * period * rate

    def noisy(s: float) -> tuple[int, float]:
        return 4242, warm(s, base) + grow(s) + r.gauss(0, noise)

    def spiky(s: float) -> tuple[int, float]:
        return 4242, warm(s, base) + grow(s) + (3 * GIB if s % 600 > 540 else 0.0)

    return [("linear", linear), ("staircase", staircase), ("noisy", noisy), ("eval-spikes", spiky)]


def leak_cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    out: list[Case] = []
    for rate_mib in SLOW_RATES_MIB + FAST_RATES_MIB:
        base = rng.uniform(3, 8) * GIB
        start = rng.choice([0.0, 300.0, 900.0])
        for shape, fn in _shapes(seed, rate_mib, base, start, rng):
            out.append(Case(f"leak-{shape}-{rate_mib:.0f}-s{seed}", fn, start, rate_mib))
    # Late onset: the same leak from the job's start and after a long plateau.
    for rate_mib in (48.0, 128.0, 1024.0):
        base = rng.uniform(3, 8) * GIB
        late = rng.uniform(1800, 2400)
        for tag, start in (("fresh", 180.0), ("late", late)):
            fn = _shapes(seed, rate_mib, base, start, random.Random(0))[0][1]
            out.append(Case(f"{tag}-onset-{rate_mib:.0f}-s{seed}", fn, start, rate_mib, pair=f"{tag}:{rate_mib}"))
    # Unattributed growth after a plateau the daemon watched for a random while.
    for rate_mib in (64.0, 256.0):
        level = rng.uniform(4, 12) * GIB
        start = rng.uniform(120, 1500)
        rate = rate_mib * MIB / 60

        def flat(s: float, level: float = level) -> tuple[int, float]:
            return 7, warm(s, level)

        def extra(s: float, start: float = start, rate: float = rate) -> float:
            return rate * max(0.0, s - start)

        out.append(Case(f"unattributed-{rate_mib:.0f}-s{seed}", flat, start, rate_mib, kind="unattributed",
                        extra=extra))
    # A daemon restart while a leak builds up: its onset must not be lost.
    base = rng.uniform(3, 8) * GIB
    fn = _shapes(seed, 128.0, base, 600.0, random.Random(1))[0][1]
    out.append(Case(f"restart-during-leak-s{seed}", fn, 600.0, 128.0, restart_at=600.0 + rng.uniform(60, 240)))
    return out


def _nonleak_series(seed: int) -> list[tuple[str, Series, RssSeries | None, float]]:
    """(name, series, host RSS, a time scale for the observation phases)."""
    rng = random.Random(seed)
    level = rng.uniform(6, 18) * GIB
    noise = rng.uniform(10, 60) * MIB
    r = random.Random(seed + 77)
    steps = sorted(rng.uniform(0, 540) for _ in range(4))
    restart_at = rng.uniform(1200, 3000)
    # A long warm-up: the pool keeps stepping for 8-12 min (first evaluation pass, first checkpoint, new
    # sequence lengths), 4-7 steps of 0.25-1 GiB, then stops for good.
    long_end = rng.uniform(480, 720)
    long_base = rng.uniform(2, 6) * GIB
    long_times = sorted([long_end, *(rng.uniform(60, long_end) for _ in range(rng.randint(3, 6)))])
    long_sizes = [rng.uniform(0.25, 1.0) * GIB for _ in long_times]
    rss_base = rng.uniform(2, 6) * GIB
    rss_growth = rng.uniform(2, 6) * GIB
    rss_over = rng.uniform(300, 900)
    eval_every = rng.uniform(300, 900)
    eval_size = rng.uniform(1.5, 3.5) * GIB
    ckpt_every = rng.uniform(300, 900)
    ckpt_size = rng.uniform(0.5, 2.0) * GIB
    # Dynamic shapes: each new largest shape grows the pool; new ones get rarer, the pool saturates. The
    # allocator rounds to 20 MiB segments.
    dyn_total = rng.uniform(2, 6) * GIB
    dyn_tau = rng.uniform(120, 480)
    # Dynamic shapes as the caching allocator sees them: each new largest shape adds a 64-256 MiB segment; new
    # shapes come fast at first, then ever more rarely (a Poisson process whose rate decays with time constant
    # shape_tau), and the pool levels off ~4-6 GiB above its start within minutes.
    shape_steps = _decaying_steps(random.Random(seed * 31 + 7), rng.uniform(4, 6) * GIB, rng.uniform(40, 180))
    # The same with a steadier stream of shapes (a curriculum of sequence lengths): each gap a steady factor longer
    # than the one before, each step near one size; for a minute or two it is a regular staircase.
    regular_steps = _geometric_steps(random.Random(seed * 37 + 11), rng.uniform(4, 6) * GIB)
    # A saturating job (the pool grows ever more slowly towards sat_total) read by a poller that stalls on a
    # busy host: flat for 5-20 s, then a jump to the current value, every 20-90 s.
    sat_total = rng.uniform(3, 8) * GIB
    sat_tau = rng.uniform(240, 900)
    stalls = _stalls(random.Random(seed * 53 + 3), 6000.0)

    def plateau(s: float) -> tuple[int, float]:
        return 4242, warm(s, level) + r.gauss(0, noise)

    def eval_empty_cache(s: float) -> tuple[int, float]:
        return 4242, warm(s, level) + (eval_size if s % eval_every > eval_every - 60 else 0.0) + r.gauss(0, noise)

    def eval_kept(s: float) -> tuple[int, float]:
        # Without empty_cache the pool keeps the first evaluation's blocks and reuses them for the next ones.
        kept = eval_size if s > eval_every - 60 else 0.0
        return 4242, warm(s, level) + kept + r.gauss(0, noise)

    def checkpoint(s: float) -> tuple[int, float]:
        return 4242, warm(s, level) + (ckpt_size if s % ckpt_every < 15 else 0.0) + r.gauss(0, noise)

    def stepwise_warmup(s: float) -> tuple[int, float]:
        return 4242, 2 * GIB + GIB * sum(1 for x in steps if s >= x)

    def long_warmup(s: float) -> tuple[int, float]:
        return 4242, warm(s, long_base) + sum(z for x, z in zip(long_times, long_sizes, strict=True) if s >= x)

    def restart(s: float) -> tuple[int, float]:
        if s < restart_at:
            return 4242, warm(s, level)
        return 4243, warm(s - restart_at, level * 1.1)

    def flipping(s: float) -> tuple[int, float]:
        low = r.random() < 0.25  # inference freeing memory between batches (csv04: 17.4 vs 17.9 GB)
        return 4242, warm(s, level) - (512 * MIB if low else 0.0) + r.gauss(0, 10 * MIB)

    def dataloader_rss(s: float) -> float:
        return rss_base + rss_growth * min(1.0, s / rss_over) + r.gauss(0, 20 * MIB)

    def dynamic_shapes(s: float) -> tuple[int, float]:
        grown = dyn_total * (1 - math.exp(-max(0.0, s) / dyn_tau))
        return 4242, warm(s, level / 2) + (grown // (20 * MIB)) * 20 * MIB + r.gauss(0, 5 * MIB)

    def shape_warmup(s: float) -> tuple[int, float]:
        return 4242, warm(s, level / 2) + sum(z for x, z in shape_steps if s >= x) + r.gauss(0, 5 * MIB)

    def shape_warmup_regular(s: float) -> tuple[int, float]:
        return 4242, warm(s, level / 2) + sum(z for x, z in regular_steps if s >= x) + r.gauss(0, 5 * MIB)

    def stalled_saturating(s: float) -> tuple[int, float]:
        # The poller stalls: its readings stay at the last fresh one, then jump to where the job is.
        seen = last_fresh(stalls, s)
        return 4242, warm(seen, level / 2) + sat_total * (1 - math.exp(-seen / sat_tau))

    return [
        ("plateau", plateau, None, 600.0),
        ("eval-empty-cache", eval_empty_cache, None, eval_every),
        ("eval-no-empty-cache", eval_kept, None, eval_every),
        ("checkpoint-spikes", checkpoint, None, ckpt_every),
        ("stepwise-warmup", stepwise_warmup, None, 540.0),
        ("long-warmup", long_warmup, None, long_end),
        ("job-restart", restart, None, restart_at),
        ("flipping", flipping, None, 600.0),
        ("dataloader-rss", plateau, dataloader_rss, rss_over),
        ("dynamic-shapes", dynamic_shapes, None, dyn_tau),
        ("shape-warmup", shape_warmup, None, shape_steps[len(shape_steps) // 2][0]),
        ("shape-warmup-regular", shape_warmup_regular, None, regular_steps[len(regular_steps) // 2][0]),
        ("stalled-saturating", stalled_saturating, None, sat_tau),
    ]


def _decaying_steps(rng: random.Random, total: float, tau: float) -> list[tuple[float, float]]:
    """(time, size) of allocator steps of 64-256 MiB adding up to ``total``, arriving as a Poisson process of rate
    n/tau x exp(-t/tau) (n steps in all: most in the first tau, the last ones minutes later)."""
    sizes: list[float] = []
    while sum(sizes) < total:
        sizes.append(rng.uniform(64, 256) * MIB)
    # Arrival times of an inhomogeneous Poisson process with that decaying rate, conditioned on n arrivals: each
    # is an independent draw from the exponential distribution of mean tau.
    times = sorted(rng.expovariate(1 / tau) for _ in sizes)
    return list(zip(times, sizes, strict=True))


def _geometric_steps(rng: random.Random, total: float) -> list[tuple[float, float]]:
    """(time, size) of steps near one size (64-256 MiB, +-15 %) adding up to ``total``, the first 4-10 s in, each
    gap 3-10 % longer than the one before (with 10 % jitter): levels off in 3-15 min."""
    size = rng.uniform(64, 256) * MIB
    gap = rng.uniform(4, 10)
    ratio = rng.uniform(1.03, 1.10)
    out: list[tuple[float, float]] = []
    t = done = 0.0
    while done < total:
        t += gap * rng.uniform(0.9, 1.1)
        z = size * rng.uniform(0.85, 1.15)
        out.append((t, z))
        done += z
        gap *= ratio
    return out


def _stalls(rng: random.Random, span: float) -> list[tuple[float, float]]:
    """(start, end) of the poller's stalls over ``span`` seconds."""
    out: list[tuple[float, float]] = []
    t = rng.uniform(0, 60)
    while t < span:
        length = rng.uniform(5, 20)
        out.append((t, t + length))
        t += length + rng.uniform(20, 90)
    return out


def last_fresh(stalls: list[tuple[float, float]], s: float) -> float:
    """The time of the reading a stalled poller still shows at ``s``: the stall's start while it lasts."""
    for a, b in stalls:
        if a <= s < b:
            return a
        if a > s:
            break
    return s


def nonleak_cases(seed: int) -> list[Case]:
    rng = random.Random(seed + 5)
    out: list[Case] = []
    for name, series, rss, scale in _nonleak_series(seed):
        case = Case(f"{name}-s{seed}", series, None, rss=rss)
        out.append(case)
        out.append(replace(case, name=f"{name}-from5s-s{seed}", observe_from=5.0))
        phase = rng.uniform(0.25, 2.0) * scale
        out.append(replace(case, name=f"{name}-from{phase:.0f}s-s{seed}", observe_from=phase))
        at = rng.uniform(0.25, 2.0) * scale + 60
        out.append(replace(case, name=f"{name}-restart{at:.0f}s-s{seed}", restart_at=at))
    return out
