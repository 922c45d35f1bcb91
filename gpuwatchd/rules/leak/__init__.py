"""``GpuMemoryLeak``: per process (``kind=gpu``), unattributed GPU memory (``kind=unattributed``) and host RSS of
a GPU process (``kind=host_rss``, pinned-memory leak). The trend machinery is in ``gpuwatchd.rules.leak.trend``.

Only processes in the latest snapshot are assessed: a job restart ends the old pid's series (it simply stops
being assessed) and the new pid starts from zero history, so its warm-up is never compared with the old run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.model import GpuSample, ProcessSample
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import (
    Condition,
    Level,
    RuleView,
    fmt_bytes,
    fmt_duration,
    fmt_gpu_memory,
    gpu_labels,
    gpu_title,
    owner_labels,
    owner_phrase,
)
from gpuwatchd.rules.config import LeakRule, RulesConfig
from gpuwatchd.rules.leak.ended import gone_processes, gpu_gone, stopped
from gpuwatchd.rules.leak.flat import FlatSeries
from gpuwatchd.rules.leak.onset import ONSET_BUCKET, candidates, find_onset, fit
from gpuwatchd.rules.leak.saturation import levels_off
from gpuwatchd.rules.leak.steps import MIN_STEPS, spreading, staircase
from gpuwatchd.rules.leak.trend import Trend, Verdict, assess, measure, sparkline, theil_sen
from gpuwatchd.store import ProcessPoint

NAME = "GpuMemoryLeak"
MIB = 1024 * 1024


def _free(g: GpuSample) -> float | None:
    if g.memory_free_bytes is not None:
        return float(g.memory_free_bytes)
    if g.memory_total_bytes is not None and g.memory_used_bytes is not None:
        return float(g.memory_total_bytes - g.memory_used_bytes)
    return None


def _per_min(rate: float) -> str:
    return f"{fmt_bytes(rate * 60)}/min"


def _eta(v: Verdict) -> str:
    return f", full in ~{fmt_duration(v.eta_seconds)}" if v.eta_seconds is not None else ""


def _annotations(t: Trend, v: Verdict, kind: str) -> dict[str, str]:
    ann = {
        advice.ACTION: advice.LEAK[kind],
        "sparkline": sparkline(t.envelope),
        "rate_bytes_per_second": f"{t.recent_rate:.0f}",
        "growth_bytes": f"{t.growth:.0f}",
    }
    if v.eta_seconds is not None:
        ann["eta_seconds"] = f"{v.eta_seconds:.0f}"
    return ann


@dataclass(frozen=True, slots=True)
class Judged:
    """A series' trend, the verdict on it, and the ``for:`` hold that verdict needs."""

    trend: Trend
    verdict: Verdict
    hold_for: float
    urgent: bool = False  # judged on a short window (_urgent)
    onset: bool = False  # judged from its onset (_from_onset)
    onset_at: float | None = None  # that onset

    @property
    def evidence(self) -> str:
        """The condition's ``evidence``: the engine times each kind's hold from that kind's own first raise. A
        rise judged from another onset (to the minute) is other evidence."""
        if self.onset and self.onset_at is not None:
            return f"onset {self.onset_at // 60:.0f}"
        return "short window" if self.urgent else "onset" if self.onset else "window"


# Urgency: a leak projected to fill the GPU in T is judged on a short window as soon as the growth seen spans
# ``urgent_evidence_share`` x T, instead of waiting for ``min_span`` of the long window. Short windows to try,
# shortest first: 2 min is the least that shows a ramp (12 buckets of 10 s from 5 s samples); they stop below
# the 10 min ``min_span`` where the long window takes over.
URGENT_WINDOWS = (60.0, 90.0, 120.0, 180.0, 240.0, 360.0, 480.0)
# Buckets per short window: the long window's 30 buckets would hold one or two samples each at 2 min; 12 keep
# two or more samples per bucket (store step 5 s) and still leave a recent half of ~5 envelope points.
URGENT_BUCKETS = 12
# Longer than this between two readings is a gap in the watch (a restart, a stopped daemon), not a slow poll: six
# history steps, three times the longest stall of a loaded poller the corpus models (bench/detect.py, stalled-*).
HISTORY_GAP = 30.0
# The span of history a short window must hold (of its length): a series younger than that (a job that just
# started) is not judged on it, so a cut-off warm-up is never half a window.
URGENT_SPAN_SHARE = 0.9
# On a short window the floor must rise in at least this share of the recent half's steps: a fast leak raises it
# almost every bucket, a single allocation step (warm-up, an evaluation pass still running) once.
URGENT_MIN_RISE_SHARE = 0.4


def _assess(trend: Trend, cfg: LeakRule, *, min_span: float, min_rises: int, free: float | None,
            min_growth: float, floor_growth: float, seen: bool = True) -> Verdict:
    return assess(
        trend,
        min_span=min_span,
        min_rate=cfg.min_rate_bytes_per_second,
        min_recent_ratio=cfg.min_recent_ratio if seen else cfg.unseen_min_recent_ratio,
        min_recent_rises=min_rises,
        noise_factor=cfg.noise_factor,
        free=free,
        horizon=cfg.horizon,
        min_growth=min_growth,
        floor_growth=floor_growth,
    )


def hold_for(cfg: LeakRule, eta: float | None, *, share: float | None = None) -> float:
    """The ``for:`` a leak needs: ``urgent_hold_share`` (or ``share``) of its projected time to full, between
    ``urgent_min_hold`` and the rule's ``for`` (no projection, or urgency off: the rule's ``for``)."""
    if eta is None or not cfg.urgent:
        return cfg.for_
    return min(cfg.for_, max(cfg.urgent_min_hold, (cfg.urgent_hold_share if share is None else share) * eta))


def since_last_gap(points: list[tuple[float, float]], since: float) -> list[tuple[float, float]]:
    """``points`` from the last gap of more than ``HISTORY_GAP`` seconds after ``since`` on (all of them without one).

    A gap is a time nobody watched (the daemon restarted, was stopped, the host slept): what the series did in it
    is unknown. A short window that spans one fits the readings on both sides as if they were joined by a straight
    line, so the growth of a warm-up that went on meanwhile read as a fast straight rise (a saturating job fired
    after a daemon restart of about a minute). The short windows judge only what was watched without a break."""
    for i in range(len(points) - 1, 0, -1):
        t = points[i - 1][0]
        if t < since:
            break
        if points[i][0] - t > HISTORY_GAP:
            return points[i:]
    return points


def _urgent(
    points: list[tuple[float, float]],
    now: float,
    cfg: LeakRule,
    *,
    free: float,
    min_growth: float,
    floor_growth: float,
    seen: bool,
) -> Judged | None:
    """The shortest short window on which the series is a leak fast enough for that window to be evidence."""
    points = since_last_gap(points, now - URGENT_WINDOWS[-1])
    # No short window can show more growth than the raw values span; most series are flat, skip them cheaply.
    latest = [(t, v) for t, v in points if t >= now - URGENT_WINDOWS[-1]]
    if not latest or max(v for _, v in latest) - min(v for _, v in latest) < max(floor_growth, 1.0):
        return None
    # A regular staircase (rules/leak/steps.py) is as good evidence as a clean straight rise, however rough its line.
    stair = staircase(latest, now)
    bent: Judged | None = None
    for window in URGENT_WINDOWS:
        if window >= cfg.min_span:
            break
        trend = measure(points, now=now, window=window, bucket=window / URGENT_BUCKETS)
        if trend is None:
            continue
        rises = max(cfg.min_recent_rises, math.ceil(URGENT_MIN_RISE_SHARE * (trend.recent_points - 1)))
        v = _assess(trend, cfg, min_span=URGENT_SPAN_SHARE * window, min_rises=rises, free=free,
                    min_growth=min_growth, floor_growth=floor_growth, seen=seen)
        if not v.leak or v.eta_decision is None:
            continue
        # A clean straight rise is evidence sooner and needs a shorter hold than a rough one (a staircase, a
        # noisy ramp): a long warm-up stepping every minute looks like a fast staircase leak for a while.
        f = fit(points, now - window, bucket=window / URGENT_BUCKETS)
        if stair is not None and (stair.steps > MIN_STEPS or now - stair.last < hold_for(cfg, v.eta_decision)):
            # A run of MIN_STEPS steps is evidence for one hold: its next step on schedule must confirm it.
            clean = True
        elif f is None or f.straightness < (cfg.onset_min_straightness if seen else cfg.unseen_min_straightness):
            if bent is None and f is not None and cfg.urgent_evidence_share * v.eta_decision <= window:
                # Passes every other test but bends on this short window (a noisy fast leak's quadratic fit bends
                # by chance at one evaluation in a few): "still growing", which keeps a pending alert without
                # firing it, instead of letting it vanish and start its hold again.
                bent = Judged(trend, Verdict(False, True, v.eta_seconds, v.eta_decision),
                              hold_for(cfg, v.eta_decision), urgent=True)
            continue
        else:
            clean = f.rate * f.span >= cfg.onset_min_snr * max(f.scatter, MIN_SCATTER)
        share = cfg.urgent_evidence_share if clean else cfg.urgent_rough_share
        if share * v.eta_decision <= window:
            hold = hold_for(cfg, v.eta_decision, share=None if clean else cfg.urgent_rough_share)
            return Judged(trend, v, hold, urgent=True)
    return bent


def _straight(points: list[tuple[float, float]], since: float, cfg: LeakRule, seen: bool, *,
              long: bool = False) -> bool:
    """The envelope since ``since`` does not flatten (a warm-up or a saturating job does). ``long``: the window
    holds min_span or more (a staircase there is judged by its steps, a looser limit)."""
    f = fit(points, since, bucket=min(ONSET_BUCKET, (points[-1][0] - since) / 12))
    limit = (cfg.min_straightness if long else cfg.onset_min_straightness) if seen else cfg.unseen_min_straightness
    return f is not None and f.straightness >= limit


# Onsets tried before the split (onset.candidates) need this many times onset_min_snr, and the series' last
# 2 minutes must rise at this share of the fit's rate (a leak goes on at its rate; a saturating rise slows).
CANDIDATE_SNR_FACTOR = 2.0
CANDIDATE_RECENT = 120.0
CANDIDATE_RECENT_RATIO = 0.9
# Scatter below this is the allocator's rounding (2 MiB pages), not a measure of the fit's quality.
MIN_SCATTER = 2.0 * MIB


def _from_onset(
    points: list[tuple[float, float]],
    now: float,
    cfg: LeakRule,
    onset: float,
    *,
    free: float | None,
    min_growth: float,
    floor_growth: float,
    tried: bool = False,
) -> Judged | None:
    """A leak judged on the evidence since its onset: as soon as the rise since then is long enough, straight
    enough and clean enough (its growth many times its scatter: a clean fit needs fewer minutes). ``tried``: an
    onset before the split, one of several tried (onset.candidates): it must be ``CANDIDATE_SNR_FACTOR`` times as
    clean, and the last ``CANDIDATE_RECENT`` must still rise at ``CANDIDATE_RECENT_RATIO`` of the fit's rate, so
    that one of them passing by chance on a rough saturating rise (a loaded poller's stalls) is not enough."""
    span = now - onset
    if span < cfg.onset_min_span:
        return None
    f = fit(points, onset)
    if f is None or f.straightness < cfg.onset_min_straightness:
        return None
    snr = cfg.onset_min_snr * (CANDIDATE_SNR_FACTOR if tried else 1.0)
    if f.rate * f.span < snr * max(f.scatter, MIN_SCATTER):
        return None
    if tried and theil_sen([p for p in points if p[0] >= now - CANDIDATE_RECENT]) < CANDIDATE_RECENT_RATIO * f.rate:
        return None
    trend = measure(points, now=now, window=span, bucket=ONSET_BUCKET)
    if trend is None:
        return None
    v = _assess(trend, cfg, min_span=cfg.onset_min_span, min_rises=cfg.min_recent_rises, free=free,
                min_growth=min_growth, floor_growth=floor_growth)
    if not v.leak:
        return None
    return Judged(trend, v, min(cfg.onset_hold, hold_for(cfg, v.eta_decision)), onset=True, onset_at=onset)


def _judge(
    points: list[tuple[float, float]],
    now: float,
    cfg: LeakRule,
    *,
    free: float | None,
    min_growth: float,
    floor_growth: float = 0.0,
    appeared: float | None = None,
) -> Judged | None:
    """``appeared``: when the series' process appeared while the daemon watched (None: it was there already)."""
    judged = _judge_series(points, now, cfg, free=free, min_growth=min_growth, floor_growth=floor_growth,
                           appeared=appeared)
    if judged is None or not judged.verdict.leak:
        return judged
    young = appeared is not None and now - appeared < cfg.young_age
    # The long window only: applied to the short windows it would bend a fast leak's fit with its warm-up's tail,
    # and to onset verdicts it delayed slow noisy leaks (bench/detect.py: delay_slow_median_s 465 -> 510 s).
    on_path = not judged.urgent and not judged.onset
    if young and free is not None and spreading([p for p in points if p[0] >= now - judged.trend.span]):
        # Not a leak: a staircase of even steps whose intervals keep growing (new input shapes ever rarer) is
        # decelerating, whichever window or onset passed it. "Growing" keeps a pending alert but cannot fire it.
        v = judged.verdict
        return Judged(judged.trend, Verdict(False, True, v.eta_seconds, v.eta_decision), judged.hold_for)
    if (young or on_path) and free is not None and _warm_up(points, now, judged, cfg, free=free,
                                                           appeared=appeared if young else None):
        # Not a leak: the rate fell across the evidence and, followed as it decays, the rise levels off with room
        # left (rules/leak/saturation.py). Nor "growing": the warm-up's next steps would fire a kept alert. Any
        # process on the long window: a warm-up's tail of ever rarer bumps goes on for tens of minutes.
        v = judged.verdict
        return Judged(judged.trend, Verdict(False, False, v.eta_seconds, v.eta_decision), judged.hold_for)
    if young and on_path and free is not None and _levels_off(points, now - judged.trend.span / 2, judged, cfg):
        # Not a leak: the rise is flattening and, where it levels off, the GPU still has room. Nor "growing":
        # a pending alert kept alive through a saturating job's slow tail would fire on its next raise.
        v = judged.verdict
        return Judged(judged.trend, Verdict(False, False, v.eta_seconds, v.eta_decision), judged.hold_for)
    return judged


# A process seen starting loads its model first (weights copied at GiB/s); the rise whose rate trend is judged
# begins this long after it appeared, or the load's rate would make any rise after it look decelerating.
LOAD_SECONDS = 30.0


def _warm_up(points: list[tuple[float, float]], now: float, judged: Judged, cfg: LeakRule, *, free: float,
             appeared: float | None) -> bool:
    """The evidence behind a leak verdict, or the rise since its onset when that began before it (a young process'
    whole warm-up: a window of a minute or two of it is nearly straight), decelerates and levels off with room
    (saturation.levels_off); not asked of a series ending in a regular staircase (a staircase leak's thirds hold a
    step more or less by chance)."""
    since = now - judged.trend.span
    if staircase([p for p in points if p[0] >= min(since, now - URGENT_WINDOWS[-1])], now) is not None:
        return False
    starts = {since}
    if appeared is not None:
        on = find_onset(points, settle=appeared + cfg.settle)
        rise = max(appeared + LOAD_SECONDS, on.t if on is not None else appeared)
        if rise < since:
            starts.add(rise)
    return any(levels_off(points, t, now, headroom=free, ratio=cfg.warmup_rate_ratio, margin=cfg.warmup_margin)
               for t in starts)


def _levels_off(points: list[tuple[float, float]], since: float, judged: Judged, cfg: LeakRule) -> bool:
    """The rise since ``since`` (the recent half of the evidence: a warm-up's tail before a leak is not a
    flattening) flattens (its quadratic fit's end slope under ``level_off_straightness`` of its
    start slope) and, followed to where it levels off, leaves most of the GPU's headroom: ``level_off_margin``
    times the growth still to come fits in the time-to-full's headroom. A saturating job (a caching allocator
    meeting ever rarer new shapes, read through a stalling poller or not) is that; a leak does not flatten."""
    f = fit(points, since, bucket=min(ONSET_BUCKET, max(1.0, (points[-1][0] - since) / 12)))
    if f is None or f.straightness >= cfg.level_off_straightness:
        return False
    eta, rate = judged.verdict.eta_decision, min(judged.trend.rate, judged.trend.recent_rate)
    if eta is None or rate <= 0:
        return False
    headroom = eta * rate
    return cfg.level_off_margin * f.peak_growth < headroom


def _judge_series(
    points: list[tuple[float, float]],
    now: float,
    cfg: LeakRule,
    *,
    free: float | None,
    min_growth: float,
    floor_growth: float = 0.0,
    appeared: float | None = None,
) -> Judged | None:
    if len(points) < 2:
        return None
    # Most series are flat: nothing to judge, skip the costly part.
    values = [v for _, v in points]
    if max(values) - min(values) < max(floor_growth, MIN_SCATTER):
        return None
    on = find_onset(points, settle=None if appeared is None else appeared + cfg.settle)
    seen = appeared is not None or (on is not None and on.seen)
    if seen and on is not None and cfg.onset:
        # A clean straight rise needs less growth than a rough one before it counts (onset_floor_share).
        for start in candidates(on, now, cfg.onset_min_span):
            judged = _from_onset(points, now, cfg, start, free=free, min_growth=min_growth,
                                 floor_growth=cfg.onset_floor_share * floor_growth, tried=start < on.t)
            if judged is not None:
                return judged
    # The long window, from the onset when it was seen (a late leak is not diluted by the plateau before it).
    window = cfg.window
    if seen and on is not None:
        window = min(cfg.window, max(cfg.min_span, now - on.t))
    trend = measure(points, now=now, window=window, bucket=cfg.bucket)
    verdict = None
    if trend is not None:
        verdict = _assess(trend, cfg, min_span=cfg.min_span, min_rises=cfg.min_recent_rises, free=free,
                          min_growth=min_growth, floor_growth=floor_growth, seen=seen)
    # A fast leak that started after a long plateau is diluted in the long window (its slope, hence its rate and
    # time to full, lag behind for many minutes): the short window's verdict, when there is one, is the truer.
    urgent = None
    if cfg.urgent and free is not None:
        urgent = _urgent(points, now, cfg, free=free, min_growth=min_growth, floor_growth=floor_growth, seen=seen)
        if urgent is not None and urgent.verdict.leak:
            return urgent
    if trend is None or verdict is None:
        return urgent  # a short window's "still growing" (bent), or nothing
    if verdict.leak and not _straight(points, now - trend.span, cfg, seen, long=True):
        verdict = Verdict(False, verdict.growing, verdict.eta_seconds, verdict.eta_decision)
    if urgent is not None and not verdict.leak and not verdict.growing:
        return urgent
    hold = hold_for(cfg, verdict.eta_decision, share=cfg.urgent_rough_share) if seen else cfg.for_
    return Judged(trend, verdict, hold)


# A process whose first reading is at most this share of what it holds now was seen at its start (a CUDA
# context before the model is loaded), even in the daemon's first snapshot.
START_SHARE = 0.1


def _appeared(hist: Sequence[ProcessPoint], watched_from: float | None) -> float | None:
    """When a process was seen to start: it appeared on a GPU the daemon already watched, or its first reading
    was small. None: it was there, busy, when watching began, so its start (warm-up included) was not seen."""
    if not hist or watched_from is None:
        return None
    first = hist[0]
    if first.t > watched_from:
        return first.t
    used = [p.used_memory_bytes for p in hist if p.used_memory_bytes is not None]
    if used and used[0] <= START_SHARE * max(used):
        return first.t
    return None


def _level(v: Verdict) -> Level | None:
    return "raise" if v.leak else "hold" if v.growing else None


def _process_name(p: ProcessSample) -> str:
    return p.name or "unknown"


GPU_DESCRIPTION = (
    "The process' GPU memory keeps rising after warm-up (its floor rises, not just spikes). If it does not level "
    "off, the job will fail with CUDA out-of-memory."
)
UNATTRIBUTED_DESCRIPTION = (
    "GPU memory that no listed process accounts for keeps rising: a process not visible to this daemon (another "
    "container or PID namespace, MIG/vGPU), a driver-side leak (contexts not destroyed, leaked IPC handles), or "
    "zombie CUDA contexts."
)
HOST_RSS_DESCRIPTION = (
    "The host memory (RSS) of a process using this GPU keeps rising, typically pinned (page-locked) host buffers "
    "allocated per step and never freed (pin_memory, cudaHostAlloc, DataLoader workers). Pinned memory cannot be "
    "swapped, so the host will run out before the GPU does."
)


# Flat series are skipped without reading their history (flat.py); the memo follows the store it last read.
_FLAT = FlatSeries()


def prime(view: RuleView, host_rss: bool) -> int:
    """Fold the history of every process series in ``view`` into the flat-series memo, once, at start after the
    rule history was restored and before the daemon serves: the first evaluation then reads only the points since,
    as every later one does. Without it the first evaluation after a restart read every series whole on the event
    loop (at 16 GPUs x 256 processes with an hour of history, 345-700 ms, one scrape's wait). Returns the series
    read; a series whose process is gone by the first snapshot is dropped from the memo at that evaluation."""
    keys = view.process_keys()
    for uuid, pid in keys:
        _FLAT.flat(view, uuid, pid, host_rss)
    _FLAT.done()
    return len(keys)


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Leak conditions for every present GPU and every process it lists."""
    cfg = config.leak
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        base = gpu_labels(view, g.uuid)
        title = gpu_title(base)
        free = _free(g)
        total = float(g.memory_total_bytes) if g.memory_total_bytes is not None else None
        min_growth = cfg.min_growth_ratio * total if total else float("inf")
        floor_growth = cfg.floor_growth_ratio * total if total else 0.0
        gpu_hist = view.gpu_history(g.uuid)
        watched_from = gpu_hist[0].t if gpu_hist else None
        for p in g.processes:
            if _FLAT.flat(view, g.uuid, p.pid, cfg.host_rss):
                continue  # nothing to judge (flat.py): the same as the whole history would say, without reading it
            hist = view.process_history(g.uuid, p.pid)
            appeared = _appeared(hist, watched_from)
            # pid is the identity; its name and owner are attribution (condition.py): late pod labels never fork it
            labels = {**base, "pid": str(p.pid)}
            owner = owner_labels(view, g.uuid, p.pid)
            attribution = {"process": _process_name(p), **owner}
            who = f"{_process_name(p)}[{p.pid}]{owner_phrase(view, g.uuid, p.pid)}"
            gpu_pts = [(x.t, float(x.used_memory_bytes)) for x in hist if x.used_memory_bytes is not None]
            judged = _judge(gpu_pts, now, cfg, free=free, min_growth=min_growth, floor_growth=floor_growth,
                            appeared=appeared)
            if judged is not None and (level := _level(judged.verdict)) is not None:
                t, v = judged.trend, judged.verdict
                out.append(
                    Condition(
                        NAME,
                        "warning",
                        {**labels, "kind": "gpu"},
                        f"{title}: {who} grows {_per_min(t.recent_rate)}{fmt_gpu_memory(g, ', ')}{_eta(v)}",
                        GPU_DESCRIPTION,
                        value=v.eta_seconds,
                        level=level,
                        annotations={**_annotations(t, v, "gpu"), **owner},
                        hold_for=judged.hold_for,
                        fire_on_hold=False,
                        evidence=judged.evidence,
                        attribution=attribution,
                    )
                )
            elif judged is not None:  # a series that rose (a flat one never had an alert): how it ended
                out.append(stopped({**labels, "kind": "gpu"}, title, who, gpu_pts[-1][1], g))
            if cfg.host_rss:
                rss_pts = [(x.t, float(x.host_rss_bytes)) for x in hist if x.host_rss_bytes is not None]
                judged = _judge(rss_pts, now, cfg, free=None, min_growth=float(cfg.host_rss_min_growth_bytes),
                                appeared=appeared)
                if judged is not None and (level := _level(judged.verdict)) is not None:
                    t, v = judged.trend, judged.verdict
                    out.append(
                        Condition(
                            NAME,
                            "warning",
                            {**labels, "kind": "host_rss"},
                            f"{title}: {who} host RSS grows {_per_min(t.recent_rate)} "
                            f"(+{fmt_bytes(t.growth)} in {fmt_duration(t.span)}, now {fmt_bytes(t.current)})",
                            HOST_RSS_DESCRIPTION,
                            value=t.recent_rate,
                            level=level,
                            annotations={**_annotations(t, v, "host_rss"), **owner},
                            hold_for=max(cfg.for_, cfg.host_rss_for),
                            fire_on_hold=False,
                            evidence=judged.evidence,
                            attribution=attribution,
                        )
                    )
                elif judged is not None:
                    out.append(stopped({**labels, "kind": "host_rss"}, title, f"{who} host RSS", rss_pts[-1][1], g))
        if cfg.unattributed:
            out.extend(_unattributed(view, now, cfg, g, free=free, min_growth=min_growth, floor_growth=floor_growth))
    _FLAT.done()
    # Resolved messages say how the leak ended (rules/leak/ended.py).
    out.extend(gone_processes(view, now, cfg, snap))
    out.extend(gpu_gone(view, snap))
    return out


def _unattributed(
    view: RuleView,
    now: float,
    cfg: LeakRule,
    g: GpuSample,
    *,
    free: float | None,
    min_growth: float,
    floor_growth: float,
) -> list[Condition]:
    base = gpu_labels(view, g.uuid)
    title = gpu_title(base)
    # With the process list cut to top-N, the sum misses processes and "unattributed" would be wrong.
    if g.processes_total is not None and g.processes_total > len(g.processes):
        return []
    pts = [
        (x.t, float(x.memory_used_bytes - x.processes_memory_bytes))
        for x in view.gpu_history(g.uuid)
        if x.memory_used_bytes is not None and x.processes_memory_bytes is not None
    ]
    judged = _judge(pts, now, cfg, free=free, min_growth=min_growth, floor_growth=floor_growth)
    if judged is None:
        return []
    if (level := _level(judged.verdict)) is None:
        return [stopped({**base, "kind": "unattributed"}, title, "memory not attributed to any process", pts[-1][1], g)]
    t, v = judged.trend, judged.verdict
    return [
        Condition(
            NAME,
            "warning",
            {**base, "kind": "unattributed"},
            f"{title}: memory not attributed to any process grows {_per_min(t.recent_rate)} "
            f"(now {fmt_bytes(t.current)}){fmt_gpu_memory(g, ', ')}{_eta(v)}",
            UNATTRIBUTED_DESCRIPTION,
            value=v.eta_seconds,
            level=level,
            annotations=_annotations(t, v, "unattributed"),
            hold_for=judged.hold_for,
            fire_on_hold=False,
            evidence=judged.evidence,
        )
    ]
