"""How a leak alert ended, for its resolved message: "stopped growing at 22.6 GiB", "exited", "GPU reset".

A resolved leak used to repeat its last firing summary ("grows 38.2 MiB/min ... full in ~7h45m"), which reads as
if it were still leaking. The leak rule now hands the engine a ``clear`` note per series (``Condition.level``):
the engine uses a note as the resolution's summary when the alert resolves, and ignores it otherwise.
- a process still listed whose series no longer raises: it stopped growing, at its current size;
- a process gone from its GPU: it exited, or its GPU was reset (the GPU came back after the process was last
  seen) or is lost/removed;
- unattributed memory: stopped growing at its current level, or the GPU is gone.
Notes for gone processes are made only for those last seen within ``keep_firing_for`` plus two minutes: that is
when their alert resolves, and it keeps the notes few on hosts whose processes churn.
"""

from __future__ import annotations

from gpuwatchd.model import GpuSample, Snapshot
from gpuwatchd.rules.condition import Condition, RuleView, fmt_bytes, gpu_labels, gpu_title
from gpuwatchd.rules.config import LeakRule

NAME = "GpuMemoryLeak"
SLACK = 120.0  # seconds past keep_firing_for during which a gone process still gets its note


def _note(labels: dict[str, str], summary: str) -> Condition:
    return Condition(NAME, "warning", labels, summary, "", level="clear")


def stopped(labels: dict[str, str], title: str, what: str, level: float | None, g: GpuSample) -> Condition:
    """``GPU 0 (A10G): python[4242] stopped growing at 22.6 GiB (22.9/24.0 GiB used)``."""
    at = f" at {fmt_bytes(level)}" if level is not None else ""
    used = ""
    if g.memory_used_bytes is not None and g.memory_total_bytes is not None:
        gib = 1024**3
        used = f" ({g.memory_used_bytes / gib:.1f}/{g.memory_total_bytes / gib:.1f} GiB used)"
    return _note(labels, f"{title}: {what} stopped growing{at}{used}")


def gone_processes(view: RuleView, now: float, cfg: LeakRule, snap: Snapshot) -> list[Condition]:
    """Notes for processes with recent history that no GPU lists any more."""
    listed = {(g.uuid, p.pid) for g in snap.gpus for p in g.processes}
    out: list[Condition] = []
    horizon = now - cfg.keep_firing_for - SLACK
    for uuid, pid in view.process_keys():
        if (uuid, pid) in listed:
            continue
        hist = view.process_history(uuid, pid)
        if not hist or hist[-1].t < horizon:
            continue
        last = hist[-1]
        base = gpu_labels(view, uuid)
        title = gpu_title(base)
        pres = view.presence.get(uuid)
        if pres is not None and pres.state != "present":
            how = f"its GPU is {pres.state}"
        elif pres is not None and pres.since > last.t:
            how = "GPU reset"
        else:
            how = "process exited"
        held = f", holding {fmt_bytes(last.used_memory_bytes)} when last seen" if last.used_memory_bytes else ""
        for kind in ("gpu", "host_rss"):
            out.append(_note({**base, "pid": str(pid), "kind": kind}, f"{title}: pid {pid}: {how}{held}"))
    return out


def gpu_gone(view: RuleView, snap: Snapshot) -> list[Condition]:
    """Unattributed-memory notes for GPUs no longer present (lost, removed)."""
    present = {g.uuid for g in snap.gpus}
    out = []
    for uuid, pres in view.presence.items():
        if uuid not in present:
            base = gpu_labels(view, uuid)
            out.append(_note({**base, "kind": "unattributed"}, f"{gpu_title(base)}: GPU {pres.state}"))
    return out
