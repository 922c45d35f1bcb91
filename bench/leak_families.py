"""Generated families of GPU memory timelines that the leak detector was not tuned on (issue 29).

bench/leak_corpus.py holds the traces the detector was tuned against, one fixed shape per class. These are families:
each trace's shape parameters (step size, gap distribution, deceleration, plateau lengths, noise, onset, GPU size,
when the daemon starts watching, whether it restarts) are drawn at random from the ranges in ``RANGES`` below.
The ranges were written down before the detector was changed for issue 29 and are not to be moved to fit it.

Seeds: ``TUNING_SEEDS`` may be looked at while tuning; ``HELD_BACK_SEEDS`` are only evaluated (bench/detect.py
reports the two apart, and tests/rules/leak/test_leak_families.py runs a couple of each). Each trace's generator is
seeded by its family's name and the seed, so adding a family changes no other family's traces.

Warm-ups (none may fire, of any kind), each described by PyTorch users:
- ``dynshape``: dynamic input shapes, as the issue reports them: the caching allocator adds a 64-256 MiB segment
  for each new largest shape; fast at first, then ever rarer (a concave rise over 1-3 min), a plateau, then a
  tail of small bumps at ever longer gaps for the rest of the job.
- ``bucketed``: sequence lengths in buckets drawn at random, longer ones rarer: the pool grows at each new longest
  bucket seen (a record), linearly or quadratically in the length (attention without a fused kernel).
- ``cudnn``: ``cudnn.benchmark = True`` with new input shapes: each new shape tries algorithms with large
  workspaces (a spike of seconds), and the pool keeps part of the largest one.
- ``grad-accum``: gradient accumulation: activations, then the gradients at the first backward, the optimizer's
  state at the first optimizer step (after k micro-batches), allocator fragmentation creeping to a level; with
  ``empty_cache()`` after each optimizer step the readings flip between two levels.
- ``eval-spikes``: evaluation passes of varying size every few minutes; the pool keeps the largest so far unless
  ``empty_cache()`` is called after each.
- ``checkpoint``: checkpoint saves (state_dict copies, a full-state gather) spiking for seconds; the first one may
  leave staging buffers in the pool.
- ``saturating``: any pool saturating exponentially, read (or not) through a poller that stalls on a busy host.
- ``mixed``: ``dynshape`` with evaluation passes and checkpoint saves on top.

Leaks (each must fire for its kind; targets in docs/alerts.md, "Generated families"):
- ``leak-fast``: 1-3.5 GiB/min (50 MiB/s is 3 GiB/min), linear, stepwise or noisy, from the job's first iteration
  (under its warm-up) or after a plateau, on GPUs where it takes at least ``FAST_MIN_TO_FULL`` to fill.
- ``leak-slow``: 2-4 MiB/s, linear, stepwise or noisy, from the start or after 10-30 min, after a dynamic-shape or
  bucketed warm-up, with or without evaluation spikes, with or without memory of other processes outside the list.
- ``leak-unattributed``: 2-4 MiB/s of GPU memory no listed process accounts for, after a warm-up.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace

from leak_corpus import Case

MIB = 1024**2
GIB = 1024**3
PID = 4242
OVERHEAD = 300 * MIB  # driver/context memory bench/detect.py adds to the GPU's used memory

# Seeds 0-99 are the tuning seeds; seeds 9000-9099 are held back: evaluated, never tuned on (bench/detect.py
# --family-seeds N runs the first N of each).
TUNING_SEEDS = range(0, 100)
HELD_BACK_SEEDS = range(9000, 9100)

# Every range the families draw from, as (low, high) for a uniform draw (counts: integers, both ends included).
# Written before tuning (issue 29); docs/alerts.md ("Generated families") lists them.
RANGES: dict[str, tuple[float, float]] = {
    # -- every trace
    "gpu_gib": (16, 80),  # drawn from GPU_SIZES_GIB, not uniform
    "load_s": (5, 30),  # model load: the weights copied in a ramp
    "noise_mib": (0, 8),  # sigma of the readings' jitter (allocator rounding, other streams)
    "observe_phase": (0.2, 1.5),  # the daemon started this share of the warm-up's length into the job
    "restart_at_s": (60, 900),  # a daemon restart (history kept in its state dir) this long into the job
    # -- dynshape: the class
    "dyn.base_gib": (2, 4),
    "dyn.rise_gib": (3, 6),  # the fast part of the warm-up ...
    "dyn.rise_s": (60, 180),  # ... lasts this long
    "dyn.step_mib": (64, 256),  # one new segment per new largest shape
    "dyn.decel": (1.5, 3.0),  # rise fraction F(t) = 1 - (1 - t/rise_s)^decel: its rate falls to 0 at rise_s
    "dyn.gap_jitter": (0, 0.6),  # each gap times U(1 - j, 1 + j)
    "dyn.plateau_s": (10, 90),
    "dyn.bump_mib": (32, 128),  # the tail: bumps ...
    "dyn.first_gap_s": (15, 60),  # ... the first this long after the plateau ...
    "dyn.gap_ratio": (1.05, 1.4),  # ... each gap this many times the one before ...
    "dyn.tail_gib": (0.3, 1.5),  # ... adding up to this
    # -- bucketed sequence lengths
    "bkt.base_gib": (2, 6),
    "bkt.buckets": (4, 16),
    "bkt.batch_s": (0.3, 2.0),  # one batch every
    "bkt.act_gib": (1, 8),  # activations of the longest bucket
    "bkt.decay": (0.1, 0.6),  # bucket k drawn with probability ~ exp(-decay k): long ones rare
    "bkt.frag_mib": (0, 64),  # fragmentation added at each new record
    # -- cuDNN autotuning
    "cud.base_gib": (2, 6),
    "cud.warm_s": (20, 120),
    "cud.shapes": (5, 40),
    "cud.shape_tau_s": (30, 300),  # new shapes' arrival times: exponential of this mean
    "cud.workspace_gib": (0.2, 2),
    "cud.trial_s": (1, 8),
    "cud.keep": (0.2, 0.8),  # share of the largest workspace the pool keeps
    # -- gradient accumulation
    "acc.weights_gib": (1, 6),
    "acc.grads": (0.5, 1.0),  # x weights
    "acc.optim": (1.0, 2.0),  # x weights (Adam: two fp32 moments)
    "acc.act_gib": (0.5, 6),
    "acc.micro_s": (0.1, 1.5),
    "acc.k": (2, 32),  # micro-batches per optimizer step
    "acc.frag_gib": (0.1, 1.0),
    "acc.frag_tau_s": (60, 600),
    # -- evaluation passes
    "ev.level_gib": (3, 10),
    "ev.warm_s": (30, 180),
    "ev.every_s": (180, 1200),
    "ev.length_s": (20, 180),
    "ev.spike_gib": (0.5, 4),
    "ev.spike_share": (0.6, 1.0),  # each pass's spike, of the largest (eval sets of varying length)
    "ev.noise_mib": (0, 30),
    # -- checkpoint saves
    "ck.every_s": (120, 1800),
    "ck.spike_gib": (0.2, 2),
    "ck.length_s": (3, 30),
    "ck.kept": (0, 1),  # share of the first save's spike the pool keeps (half the traces keep none)
    # -- saturating, stalling poller
    "sat.level_gib": (1, 8),
    "sat.tau_s": (60, 900),
    "sat.stall_s": (5, 20),
    "sat.between_s": (10, 90),
    "sat.noise_mib": (0, 20),
    # -- leaks
    "fast.rate_gib_min": (1, 3.5),
    "fast.step_s": (5, 30),  # stepwise: one step of rate x step_s every step_s
    "fast.noise_mib": (10, 80),  # noisy
    "fast.late_s": (180, 1200),  # the leak begins after the warm-up, this long into the job (half the traces)
    "slow.rate_mib_s": (2, 4),
    "slow.step_s": (60, 480),
    "slow.noise_mib": (10, 60),
    "slow.late_s": (600, 1800),
    "slow.spike_gib": (1, 4),  # evaluation spikes over a slow leak
    "slow.spike_every_s": (300, 900),
    "slow.spike_s": (30, 120),
    "slow.others_gib": (1, 6),  # memory of other processes not in the list
}
GPU_SIZES_GIB = (16, 24, 40, 80)
# A fast leak that fills the GPU within this long of its onset leaves nothing to act on at a 5 s poll; such draws
# are drawn again (the 50 MiB/s from a job's start on 16 GiB takes ~4.3 min).
FAST_MIN_TO_FULL = 240.0
# A slow leak's GPU is taken one size larger while less than this would be left when the leak begins.
SLOW_MIN_ROOM = 2 * GIB
# How long each job is simulated: warm-ups 45 min (the tail saturates over 40), leaks 120 min (they stop
# at the alert or when full; one not fired by then counts as missed).
WARMUP_MINUTES = 45.0
LEAK_MINUTES = 120.0
WARMUPS = ("dynshape", "bucketed", "cudnn", "grad-accum", "eval-spikes", "checkpoint", "saturating", "mixed")
LEAKS = ("leak-fast", "leak-slow", "leak-unattributed")
# A leak at or above this rate is fast (its target: fired before 30 % of its time to full has passed).
FAST_RATE_MIB = 1024.0

Reading = Callable[[float], float]


class Draw:
    """Uniform draws from ``RANGES`` on one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, key: str) -> float:
        lo, hi = RANGES[key]
        return self.rng.uniform(lo, hi)

    def count(self, key: str) -> int:
        lo, hi = RANGES[key]
        return self.rng.randint(int(lo), int(hi))

    def gib(self, key: str) -> float:
        return self(key) * GIB

    def mib(self, key: str) -> float:
        return self(key) * MIB

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


def _steps_reading(steps: Sequence[tuple[float, float]]) -> Reading:
    """Sum of the (time, size) steps at or before ``s``."""
    times = [t for t, _ in steps]
    cum: list[float] = []
    acc = 0.0
    for _, z in steps:
        acc += z
        cum.append(acc)

    def at(s: float) -> float:
        i = bisect_right(times, s)
        return cum[i - 1] if i else 0.0

    return at


def _load(d: Draw, base: float) -> Reading:
    load_s = d("load_s")
    return lambda s: base * min(1.0, max(0.0, s) / load_s)


def _warm(level: float, over: float) -> Reading:
    return lambda s: level * (1 - math.exp(-3 * max(0.0, s) / over))


def _noise(d: Draw, key: str = "noise_mib") -> Reading:
    sigma = d.mib(key)
    r = random.Random(d.rng.random())
    return lambda s: r.gauss(0.0, sigma) if sigma > 0 else 0.0


def _spikes(every: float, length: float, size: Callable[[int], float], phase: float = 0.0) -> Reading:
    """A spike of ``size(i)`` for ``length`` seconds at the end of every ``every`` seconds (the i-th pass)."""

    def at(s: float) -> float:
        x = s + phase
        i = int(x // every)
        return size(i) if x % every > every - length and s > 0 else 0.0

    return at


def dynshape(d: Draw) -> tuple[Reading, float]:
    """The issue's warm-up: (reading, the fast rise's length)."""
    base = d.gib("dyn.base_gib")
    load = _load(d, base)
    rise, rise_s, decel, jitter = d.gib("dyn.rise_gib"), d("dyn.rise_s"), d("dyn.decel"), d("dyn.gap_jitter")
    sizes: list[float] = []
    while sum(sizes) < rise:
        sizes.append(d.mib("dyn.step_mib"))
    total = sum(sizes)
    start = RANGES["load_s"][1]  # the shapes come once training runs, after the load
    times, acc, prev = [], 0.0, 0.0
    for z in sizes:
        acc += z
        t = rise_s * (1 - (1 - min(1.0, acc / total)) ** (1 / decel))
        gap = max(0.5, (t - prev) * d.rng.uniform(1 - jitter, 1 + jitter))
        prev = t
        times.append((times[-1] if times else start) + gap)
    steps = list(zip(times, sizes, strict=True))
    t = times[-1] + d("dyn.plateau_s")
    gap, bump, tail, added = d("dyn.first_gap_s"), d.mib("dyn.bump_mib"), d.gib("dyn.tail_gib"), 0.0
    ratio = d("dyn.gap_ratio")
    while added + bump <= tail and t < WARMUP_MINUTES * 60:
        t += gap
        steps.append((t, bump))
        added += bump
        gap *= ratio
    stepped, noise = _steps_reading(steps), _noise(d)
    return (lambda s: load(s) + stepped(s) + noise(s)), start + rise_s


def bucketed(d: Draw) -> tuple[Reading, float]:
    base = d.gib("bkt.base_gib")
    load = _load(d, base)
    k, batch_s, act = d.count("bkt.buckets"), d("bkt.batch_s"), d.gib("bkt.act_gib")
    decay, power = d("bkt.decay"), d.rng.choice((1, 2))
    weights = [math.exp(-decay * i) for i in range(k)]
    lengths = [2 ** (i / 2) for i in range(k)]  # buckets a half-octave apart
    start = RANGES["load_s"][1]
    steps: list[tuple[float, float]] = []
    level, longest, t = 0.0, -1, start
    while t < WARMUP_MINUTES * 60 and longest < k - 1:
        b = d.rng.choices(range(k), weights)[0]
        if b > longest:
            longest = b
            new = act * (lengths[b] / lengths[-1]) ** power + d.mib("bkt.frag_mib")
            new = math.ceil(new / (20 * MIB)) * 20 * MIB  # large segments are rounded to 20 MiB
            if new > level:
                steps.append((t, new - level))
                level = new
        t += batch_s
    stepped, noise = _steps_reading(steps), _noise(d)
    first_records = steps[len(steps) // 2][0] if steps else 60.0
    return (lambda s: load(s) + stepped(s) + noise(s)), first_records


def cudnn(d: Draw) -> tuple[Reading, float]:
    base, warm_s = d.gib("cud.base_gib"), d("cud.warm_s")
    warm = _warm(base, warm_s)
    n, tau, keep = d.count("cud.shapes"), d("cud.shape_tau_s"), d("cud.keep")
    arrivals = sorted(warm_s + d.rng.expovariate(1 / tau) for _ in range(n))
    trials = [(t, d.gib("cud.workspace_gib"), d("cud.trial_s")) for t in arrivals]
    kept_steps: list[tuple[float, float]] = []
    kept = 0.0
    for t, ws, length in trials:
        if keep * ws > kept:
            kept_steps.append((t + length, keep * ws - kept))
            kept = keep * ws
    stepped, noise = _steps_reading(kept_steps), _noise(d)
    starts = [t for t, _, _ in trials]

    def at(s: float) -> float:
        i = bisect_right(starts, s) - 1
        spike = 0.0
        if i >= 0 and s < trials[i][0] + trials[i][2]:
            spike = max(0.0, trials[i][1] - stepped(s))  # the trial's workspace beyond what the pool holds
        return warm(s) + stepped(s) + spike + noise(s)

    return at, arrivals[len(arrivals) // 2]


def grad_accum(d: Draw) -> tuple[Reading, float]:
    weights = d.gib("acc.weights_gib")
    load = _load(d, weights)
    grads, optim, act = d("acc.grads") * weights, d("acc.optim") * weights, d.gib("acc.act_gib")
    micro, k = d("acc.micro_s"), d.count("acc.k")
    frag, frag_tau = d.gib("acc.frag_gib"), d("acc.frag_tau_s")
    empty_cache = d.chance(0.5)
    start = RANGES["load_s"][1]
    cycle = micro * k
    noise = _noise(d)

    def at(s: float) -> float:
        x = s - start
        if x < 0:
            return load(s)
        v = weights + act + grads + frag * (1 - math.exp(-x / frag_tau))
        if x >= cycle:
            v += optim
            # empty_cache() after each optimizer step: the activations' blocks go back to the driver until the
            # next micro-batch's forward takes them again (the first micro-batch of each cycle)
            if empty_cache and (x % cycle) < min(micro, 0.5 * cycle) * 0.5:
                v -= act
        return v + noise(s)

    return at, start + cycle + 3 * frag_tau


def eval_spikes(d: Draw) -> tuple[Reading, float]:
    level, warm_s = d.gib("ev.level_gib"), d("ev.warm_s")
    warm = _warm(level, warm_s)
    every, length, spike = d("ev.every_s"), d("ev.length_s"), d.gib("ev.spike_gib")
    lo, hi = RANGES["ev.spike_share"]
    shares = [d.rng.uniform(lo, hi) for _ in range(int(WARMUP_MINUTES * 60 / every) + 2)]
    empty_cache = d.chance(0.5)
    passes = _spikes(every, length, lambda i: spike * shares[i])
    noise = _noise(d, "ev.noise_mib")

    def at(s: float) -> float:
        p = passes(s)
        if not empty_cache:  # the pool keeps the largest pass so far
            done = int(s // every)
            kept = max((spike * shares[i] for i in range(done)), default=0.0)
            p = max(p, kept)
        return warm(s) + p + noise(s)

    return at, every


def checkpoint(d: Draw, base: Reading | None = None) -> tuple[Reading, float]:
    every, spike, length = d("ck.every_s"), d.gib("ck.spike_gib"), d("ck.length_s")
    kept = d("ck.kept") * spike if d.chance(0.5) else 0.0
    if base is None:
        level, warm_s = d.gib("ev.level_gib"), d("ev.warm_s")
        base = _warm(level, warm_s)
    saves = _spikes(every, length, lambda i: spike)
    noise = _noise(d)
    underlying = base

    def at(s: float) -> float:
        held = kept if s >= every else 0.0
        return underlying(s) + max(saves(s), held) + noise(s)

    return at, every


def saturating(d: Draw) -> tuple[Reading, float]:
    level, tau = d.gib("sat.level_gib"), d("sat.tau_s")
    base = _load(d, d.gib("dyn.base_gib"))
    stalls: list[tuple[float, float]] = []
    if d.chance(0.5):
        t = d("sat.between_s")
        while t < WARMUP_MINUTES * 60:
            length = d("sat.stall_s")
            stalls.append((t, t + length))
            t += length + d("sat.between_s")
    starts = [a for a, _ in stalls]
    noise = _noise(d, "sat.noise_mib")

    def at(s: float) -> float:
        i = bisect_right(starts, s) - 1
        seen = stalls[i][0] if i >= 0 and s < stalls[i][1] else s  # a stalled poller still shows its last reading
        return base(seen) + level * (1 - math.exp(-max(0.0, seen) / tau)) + noise(seen)

    return at, tau


def mixed(d: Draw) -> tuple[Reading, float]:
    dyn, scale = dynshape(d)
    every, length, spike = d("ev.every_s"), d("ev.length_s"), d.gib("ev.spike_gib")
    passes = _spikes(every, length, lambda i: spike)
    with_passes: Reading = lambda s: dyn(s) + passes(s)  # noqa: E731
    return checkpoint(d, with_passes)[0], scale


GENERATORS: dict[str, Callable[[Draw], tuple[Reading, float]]] = {
    "dynshape": dynshape,
    "bucketed": bucketed,
    "cudnn": cudnn,
    "grad-accum": grad_accum,
    "eval-spikes": eval_spikes,
    "checkpoint": checkpoint,
    "saturating": saturating,
    "mixed": mixed,
}


def _gpu(d: Draw) -> int:
    return d.rng.choice(GPU_SIZES_GIB) * GIB


def _observed(d: Draw, case: Case, scale: float) -> Case:
    """Where the daemon starts watching (the job's start, 5 s in, or for a warm-up a random phase of it: a leak is
    watched from before it began) and whether it restarts."""
    how = d.rng.random()
    if how < 0.4:
        observe = 0.0
    elif how < 0.7 or case.leak_start is not None:
        observe = 5.0
    else:
        observe = d("observe_phase") * scale
    restart = d("restart_at_s") + observe if d.chance(0.25) else None
    return replace(case, observe_from=observe, restart_at=restart)


def warmup_case(family: str, seed: int) -> Case:
    d = Draw(random.Random(f"{family}:{seed}"))
    reading, scale = GENERATORS[family](d)
    case = Case(f"{family}-g{seed}", lambda s: (PID, max(0.0, reading(s))), None, total=_gpu(d),
                minutes=WARMUP_MINUTES, family=family)
    return _observed(d, case, scale)


def _leak_shape(d: Draw, rate: float, start: float, step_key: str, noise_key: str) -> tuple[str, Reading]:
    shape = d.rng.choice(("linear", "stepwise", "noisy"))
    if shape == "linear":
        return shape, lambda s: rate * max(0.0, s - start)
    if shape == "stepwise":
        period = d(step_key)
        return shape, lambda s: (max(0.0, s - start) // period) * period * rate
    sigma = d.mib(noise_key)
    r = random.Random(d.rng.random())
    return shape, lambda s: rate * max(0.0, s - start) + r.gauss(0.0, sigma)


def _headroom(total: float, reading: Reading, at: float) -> float:
    return total - OVERHEAD - max(reading(at), reading(WARMUP_MINUTES * 60))


def leak_case(family: str, seed: int) -> Case:
    d = Draw(random.Random(f"{family}:{seed}"))
    total = _gpu(d)
    under, scale = (dynshape if d.chance(0.5) else bucketed)(d)
    extra: Callable[[float], float] | None = None
    kind = "gpu"
    if family == "leak-fast":
        rate_mib = d("fast.rate_gib_min") * 1024
        late = d.chance(0.5)
        start = d("fast.late_s") if late else RANGES["load_s"][1]
        # Drawn again (rate, then GPU) while the leak would fill the GPU within FAST_MIN_TO_FULL.
        for _ in range(20):
            if _headroom(total, under, start) / (rate_mib * MIB / 60) >= FAST_MIN_TO_FULL:
                break
            rate_mib = d("fast.rate_gib_min") * 1024
            total = _gpu(d)
        shape, leak = _leak_shape(d, rate_mib * MIB / 60, start, "fast.step_s", "fast.noise_mib")
    else:
        rate_mib = d("slow.rate_mib_s") * 60
        start = d("slow.late_s") if d.chance(0.5) else RANGES["load_s"][1]
        shape, leak = _leak_shape(d, rate_mib * MIB / 60, start, "slow.step_s", "slow.noise_mib")
        if d.chance(0.5):
            every, length, spike = d("slow.spike_every_s"), d("slow.spike_s"), d.gib("slow.spike_gib")
            passes = _spikes(every, length, lambda i: spike)
            shape += "+eval"
        else:
            passes = lambda s: 0.0  # noqa: E731
        if family == "leak-unattributed":
            kind, extra = "unattributed", leak
            leak = lambda s: 0.0  # noqa: E731
        elif d.chance(0.33):
            others = d.gib("slow.others_gib")
            extra = lambda s: others  # noqa: E731
            shape += "+others"
        base_under = under
        under = lambda s: base_under(s) + passes(s)  # noqa: E731
        # A larger GPU while the warm-up, the spikes and the others' memory would leave under SLOW_MIN_ROOM when
        # the leak begins (or fill it before).
        taken = max(under(float(t)) for t in range(0, int(start) + 1800, 5)) + (extra(0.0) if kind == "gpu" and
                                                                                 extra else 0.0)
        while total - OVERHEAD - taken < SLOW_MIN_ROOM and total < GPU_SIZES_GIB[-1] * GIB:
            total = next(g * GIB for g in GPU_SIZES_GIB if g * GIB > total)
    underlying = under
    case = Case(f"{family}-{shape}-{rate_mib:.0f}-g{seed}", lambda s: (PID, max(0.0, underlying(s) + leak(s))), start,
                rate_mib, kind=kind, extra=extra, total=total, minutes=LEAK_MINUTES, family=family)
    return _observed(d, case, scale)


def cases(seeds: Sequence[int] | range) -> list[Case]:
    """Every family's trace for each seed: warm-ups, then leaks."""
    return [warmup_case(f, s) for s in seeds for f in WARMUPS] + [leak_case(f, s) for s in seeds for f in LEAKS]
