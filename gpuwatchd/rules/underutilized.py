"""``GpuUnderutilized`` (info, off by default): a GPU whose memory is held but whose SMs sit idle, for a long time.

On a shared host that GPU is taken from everyone else while doing nothing: the classic case is a training job
stalled on data loading (CPU-bound input pipeline, slow storage), or a notebook holding a model in memory. The
message names the process holding the most memory (pid, name, user where known), so the owner can be told.

Activity is GPM's SM activity where the GPU has it (Hopper and newer: the share of SM cycles with a warp resident,
``sources/nvml/worker/gpm.py``), else NVML's ``utilization.gpu`` (the share of time any kernel ran: coarser, a single
tiny kernel counts as busy, so it under-reports idleness, never over-reports it). Hysteresis: the alert starts at
``max_activity_ratio`` or below, and a pending or firing alert holds up to ``clear_activity_ratio``, so a stalled job's
short bursts of compute neither reset the ``for:`` timer nor flap the alert.
"""

from __future__ import annotations

from gpuwatchd.model import GpuSample, ProcessSample
from gpuwatchd.rules.condition import (
    Condition,
    Level,
    RuleView,
    fmt_bytes,
    fmt_share,
    gpu_labels,
    gpu_title,
    owner_labels,
    owner_phrase,
)
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuUnderutilized"

DESCRIPTION = (
    "The GPU's memory is held but its SMs have been idle for a long time, so nobody else on this shared host can "
    "use it. A training job usually shows this when it waits on its input pipeline (data loading on the CPU, slow "
    "storage)."
)


def activity(g: GpuSample) -> tuple[float, str] | None:
    """(SM activity 0..1, what it is) of a GPU: GPM SM activity where present, else NVML utilization.gpu."""
    if g.gpm_sm_activity_ratio is not None:
        return g.gpm_sm_activity_ratio, "SM activity"
    if g.utilization_gpu_ratio is not None:
        return g.utilization_gpu_ratio, "GPU utilization"
    return None


def holder(g: GpuSample) -> ProcessSample | None:
    """The process holding the most GPU memory (the kept top-N are sorted by memory already; be safe anyway)."""
    procs = [p for p in g.processes if p.used_memory_bytes is not None]
    return max(procs, key=lambda p: (p.used_memory_bytes or 0, -p.pid)) if procs else None


def _who(p: ProcessSample | None) -> str:
    if p is None:
        return "no process NVML can attribute it to"
    name = p.name or "unknown process"
    user = f", user {p.user}" if p.user else ""
    return f"{name} (pid {p.pid}{user})"


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per present GPU that holds memory while its SMs are idle."""
    cfg = config.underutilized
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        used, total, act = g.memory_used_bytes, g.memory_total_bytes, activity(g)
        if used is None or not total or act is None:
            continue
        share = used / total
        ratio, what = act
        p = holder(g)
        base = gpu_labels(view, g.uuid)
        # the holder's pid is the identity; its name and owner are attribution (rules/condition.py)
        labels = {**base, "pid": str(p.pid)} if p is not None else base
        owner = owner_labels(view, g.uuid, p.pid) if p is not None else {}
        attribution = {"process": p.name or "", **owner} if p is not None else {}
        level: Level
        if share < cfg.min_memory_ratio:
            # clear: only the message of a resolution (the engine ignores it for an alert that is not active)
            level = "clear"
            summary = f"{gpu_title(base)}: memory released ({fmt_bytes(used)} of {fmt_bytes(total)} held)"
        elif ratio > cfg.clear_activity_ratio:
            level, summary = "clear", f"{gpu_title(base)}: busy again, {what} {fmt_share(ratio)}"
        else:
            level = "raise" if ratio <= cfg.max_activity_ratio else "hold"
            summary = (f"{gpu_title(base)}: {fmt_bytes(used)} of {fmt_bytes(total)} held ({fmt_share(share)}) but "
                       f"{what} is {fmt_share(ratio)}; the memory is held by {_who(p)}"
                       f"{owner_phrase(view, g.uuid, p.pid) if p is not None else ''}")
        out.append(Condition(NAME, "info", labels, summary, DESCRIPTION, value=ratio, level=level,
                             attribution=attribution, annotations=owner))
    return out
