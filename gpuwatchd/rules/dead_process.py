"""``GpuMemoryHeldByDeadProcess``: GPU memory held by a process that no longer exists, or by no process at all.

A process exits or is killed, but its CUDA context survives: a zombie its parent never reaps, a process stuck
exiting, a child that inherited the ``/dev/nvidia*`` file descriptors, a container whose pid namespace is gone, an
orphaned MPS client. NVML keeps listing the pid with its memory (or lists nothing while the memory stays used), and
the next job on that GPU dies of out-of-memory. Two conditions, both ``warning``:

- **dead pid** (labels ``uuid``, ``gpu``, ``pid``): a pid NVML lists on the GPU whose process is a zombie, or that
  has no ``/proc`` entry while the daemon runs in the host's pid namespace (sources/nvml/worker/processes.py,
  ``host_state``), holding at least ``min_memory_bytes``, for ``for``;
- **no process** (labels ``uuid``, ``gpu``): the GPU lists no process at all (the full list, not a top-N cut) while
  its used memory is at least ``unattributed_min_bytes``, for ``unattributed_for``.

The evidence rule for "dead" (docs/alerts.md): NVML reports pids of the host's pid namespace. Only when the daemon
itself runs there (``/proc/self/ns/pid`` is the initial namespace, inode 0xEFFFFFFC: on the host, or a container
with ``--pid=host`` / ``hostPID: true``) does a pid missing from its ``/proc`` mean the process is gone, and does an
empty process list mean no process. Anywhere else a missing pid is ``hidden`` (a process in another container is
invisible, not dead) and an empty list proves nothing (the driver lists only the caller's namespace): neither
condition is raised there, except for zombies, which the daemon sees in its own namespace.
"""

from __future__ import annotations

import functools
import time

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.rules.condition import (
    Condition,
    RuleView,
    fmt_bytes,
    fmt_duration,
    fmt_gpu_memory,
    gpu_labels,
    gpu_title,
)
from gpuwatchd.rules.config import DeadProcessRule, RulesConfig

NAME = "GpuMemoryHeldByDeadProcess"
DEAD_STATES = ("gone", "zombie")
# A resolved note for a pid no longer listed is made while its history is this recent (as rules/leak/ended.py).
NOTE_HORIZON = 300.0

DEAD_DESCRIPTION = (
    "NVML still lists GPU memory for a process that no longer exists, so no job can use that memory until it is "
    "released: something keeps its CUDA context alive (a child that inherited /dev/nvidia*, an MPS server, a "
    "process stuck exiting in D state, a zombie its parent has not reaped)."
)
NO_PROCESS_DESCRIPTION = (
    "The GPU's memory is in use but the driver lists no process holding it: contexts of processes that died "
    "without the driver releasing them (a container whose pid namespace is gone, an orphaned MPS client, a crash "
    "in the driver's teardown)."
)


def _clock(t: float) -> str:
    # To the minute: the summary stays the same from one evaluation to the next (the age moves once a minute).
    return _minute(int(t // 60))


@functools.lru_cache(maxsize=256)
def _minute(minute: int) -> str:
    """The UTC minute as text, memoized: every dead pid's summary has one, every evaluation (4096 a second at 16
    GPUs x 256 processes when they all died), and most share a few minutes."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(minute * 60))


def _since(now: float, since: float | None) -> str:
    if since is None:
        return ""
    return f" since {_clock(since)} ({fmt_duration(now - since)} ago)"


def _what(p: ProcessSample) -> str:
    name = f" ({p.name})" if p.name else ""
    if p.host_state == "zombie":
        return f"pid {p.pid}{name}, a zombie (exited, not reaped by its parent)"
    return f"pid {p.pid}{name}, which no longer exists"


# (uuid, pid) -> what a dead pid's condition was made of at the family's last run, and the condition:
# (process sample, GPU labels, GPU memory phrase, min_memory_bytes, since, since phrase, condition).
_Made = dict[tuple[str, int], tuple[ProcessSample, dict[str, str], str, int, float | None, str, Condition]]


class _Last:
    """The last run's conditions: a process whose sample object (the daemon's decoder keeps an unchanged process'
    object), GPU and words are the same gets the same condition object back, which the engine then neither
    fingerprints nor applies again (16x256 with every process gone: 4,096 conditions every 10 s). Everything the
    condition is made of is in the key or compared, so the object is always the one that would be made."""

    def __init__(self) -> None:
        self.made: _Made = {}


_LAST = _Last()



def _dead(view: RuleView, now: float, cfg: DeadProcessRule, g: GpuSample, base: dict[str, str], *,
          made: _Made, phrases: dict[float | None, str]) -> list[Condition]:
    title, memory = gpu_title(base), fmt_gpu_memory(g, "; ")
    out: list[Condition] = []
    for p in g.processes:
        if p.host_state not in DEAD_STATES:  # live, hidden (another pid namespace) or not looked up
            continue
        used = p.used_memory_bytes
        small = used is not None and used < cfg.min_memory_bytes
        age = p.host_state_seconds
        # dead since the snapshot's time less the age the worker measured then (now, for a sample without it)
        since = None if small or age is None else (p.host_state_at if p.host_state_at is not None else now) - age
        # made once per time of death in a run (the processes found dead at one poll share it)
        phrase = "" if small else phrases.get(since) or phrases.setdefault(since, _since(now, since))
        key = (g.uuid, p.pid)
        last = _LAST.made.get(key)
        if (last is not None and last[0] is p and last[4] == since and last[5] == phrase and last[2] == memory
                and last[3] == cfg.min_memory_bytes and last[1] == base):
            c = last[6]
        elif small:
            c = Condition(NAME, "warning", {**base, "pid": str(p.pid)},
                          f"{title}: pid {p.pid} holds {fmt_bytes(used or 0)} now{memory}", "", level="clear")
        else:
            held = fmt_bytes(used) if used is not None else "memory (amount unknown)"
            summary = (f"{title}: {held} held by {_what(p)}{phrase}{memory}; "
                       f"find the holder with `fuser -v /dev/nvidia*`, reset the GPU if none")
            annotations = {"held_bytes": str(used)} if used is not None else {}
            if since is not None:
                annotations["dead_since"] = f"{since:.0f}"
            c = Condition(NAME, "warning", {**base, "pid": str(p.pid)}, summary, DEAD_DESCRIPTION,
                          value=float(used or 0), annotations=annotations)
        made[key] = (p, base, memory, cfg.min_memory_bytes, since, phrase, c)
        out.append(c)
    return out


def _no_process_since(view: RuleView, uuid: str, threshold: float, now: float) -> float:
    """When the current stretch of "used >= threshold with no process memory" began (the GPU's history)."""
    since = now
    for x in reversed(view.gpu_history(uuid)):
        if x.memory_used_bytes is None or x.memory_used_bytes < threshold or (x.processes_memory_bytes or 0) > 0:
            break
        since = x.t
    return since


def _no_process(view: RuleView, now: float, cfg: DeadProcessRule, g: GpuSample, base: dict[str, str], *,
                snap: Snapshot) -> list[Condition]:
    # Only a full, empty process list read from the host's pid namespace is "no process" (module docstring).
    if snap.host_pid_namespace is not True or g.processes or g.processes_total != 0:
        return []
    if g.memory_used_bytes is None or g.mig_mode_current:  # a MIG GPU's processes are on its MIG devices
        return []
    title, memory = gpu_title(base), fmt_gpu_memory(g, "; ")
    used = g.memory_used_bytes
    if used < cfg.unattributed_min_bytes:
        return [Condition(NAME, "warning", base, f"{title}: memory released ({fmt_bytes(used)} used, no process)",
                          "", level="clear")]
    since = _no_process_since(view, g.uuid, cfg.unattributed_min_bytes, now)
    summary = (f"{title}: {fmt_bytes(used)} used with no process listed{_since(now, since)}{memory}; "
               f"find the holder with `fuser -v /dev/nvidia*`, reset the GPU if none")
    return [Condition(NAME, "warning", base, summary, NO_PROCESS_DESCRIPTION, value=float(used),
                      annotations={"held_bytes": str(used), "dead_since": f"{since:.0f}"},
                      hold_for=cfg.unattributed_for)]


def _gone_pids(view: RuleView, now: float, snap: Snapshot) -> list[Condition]:
    """Resolved notes for pids no GPU lists any more (the driver released their memory, or the GPU was reset)."""
    listed = {(g.uuid, p.pid) for g in snap.gpus for p in g.processes}
    out: list[Condition] = []
    for uuid, pid in view.process_keys():
        if (uuid, pid) in listed:
            continue
        hist = view.process_history(uuid, pid)
        if not hist or hist[-1].t < now - NOTE_HORIZON:
            continue
        base = gpu_labels(view, uuid)
        pres = view.presence.get(uuid)
        how = (f"its GPU is {pres.state}" if pres is not None and pres.state != "present"
               else "GPU reset" if pres is not None and pres.since > hist[-1].t
               else "the driver released its memory")
        out.append(Condition(NAME, "warning", {**base, "pid": str(pid)}, f"{gpu_title(base)}: pid {pid}: {how}",
                             "", level="clear"))
    return out


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Dead-pid and no-process conditions for every present GPU."""
    cfg = config.dead_process
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    made: _Made = {}
    phrases: dict[float | None, str] = {}
    for g in snap.gpus:
        base = gpu_labels(view, g.uuid)
        out.extend(_dead(view, now, cfg, g, base, made=made, phrases=phrases))
        out.extend(_no_process(view, now, cfg, g, base, snap=snap))
    out.extend(_gone_pids(view, now, snap))
    _LAST.made = made
    return out
