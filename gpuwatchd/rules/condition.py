"""What a rule family returns (``Condition``), what it reads (``RuleView``), and shared label/format helpers.

A family is a pure function ``(view, now, config) -> list[Condition]``. It says, per alert identity, whether
the condition holds now; the engine owns time (``for:``, ``keep_firing_for``, resolved retention).

``level`` carries hysteresis without state in the family:
- ``raise``: the raise threshold holds; starts an alert or keeps one going.
- ``hold``: between the clear and the raise threshold; keeps an active alert going, never starts one.
- ``clear``: known to be clear; only supplies the message of the resolution (e.g. "reattached at index 1").
An identity absent from the list is clear too.

``hold_for`` and ``fire_on_hold`` let one condition tighten or relax its rule's ``for:``, and ``evidence`` says
which of a rule's kinds of evidence a verdict rests on, so each kind is timed on its own (see the fields).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpuwatchd.model import DockSample, GpuPresence, GpuSample, ProcessOwner, Severity, Snapshot, XidEvent
from gpuwatchd.model.kernel_log import KernelLogStats
from gpuwatchd.rules import advice
from gpuwatchd.store import GpuPoint, ProcessPoint

Level = Literal["raise", "hold", "clear"]


@dataclass(frozen=True, slots=True)
class Condition:
    """One alert identity's condition at one evaluation."""

    name: str  # alertname
    severity: Severity
    labels: Mapping[str, str]  # identity labels besides alertname/severity/host (uuid, gpu, model, pid, ...)
    summary: str
    description: str
    value: float | None = None
    level: Level = "raise"
    annotations: Mapping[str, str] = field(default_factory=dict)
    # This condition's ``for:`` in seconds, instead of its rule's (the leak rule waits less for a leak projected
    # to fill the GPU soon). None: the rule's ``for``.
    hold_for: float | None = None
    # False: a pending alert completes its ``for:`` only at a ``raise``; ``hold`` keeps it pending but cannot
    # fire it (the leak rule's ``hold`` test is loose and would confirm a warm-up that already stopped).
    fire_on_hold: bool = True
    # What the verdict rests on, when a rule judges one identity on several kinds of evidence (the leak rule: a
    # short window, the rise since its onset, the long window). A pending alert fires once the firing condition's
    # own ``for:`` has passed since a condition of the same evidence first raised it in this episode, or since
    # the current unbroken run of raises (of any kinds) began; not merely since the alert opened: a verdict of
    # one kind that opened it and was then withdrawn to a ``hold`` lends its age to no other (issue 22: a
    # stalling poller's saturating job). None: one kind, timed from the alert's ``active_at`` as before.
    evidence: str | None = None
    # Who owns what the alert is about (the process' name, its container, pod, Slurm job: ``owner_labels``): labels
    # of the alert, never of its identity (issue 28). They can arrive after the alert fired (the kubelet answering
    # late) or change; the engine tracks the alert by ``labels`` alone, follows these while it is pending and
    # freezes them into its labels when it fires (what receivers and Alertmanager saw stays one alert). The family
    # puts the current owner in ``annotations`` too, so the next message says it (docs/alerts.md, "Identity").
    attribution: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The alert's advice (rules/advice.py): a rule whose advice depends on evidence sets ``action`` itself; the
        # others get their alertname's. A clear note says what happened, not what to do.
        if self.level != "clear":
            filled = advice.annotate(self.name, self.annotations, self.labels.get("gpu"))
            if filled is not None:
                object.__setattr__(self, "annotations", filled)


class RuleView(Protocol):
    """The read side of ``gpuwatchd.store.Store`` that rules use (a Store satisfies it)."""

    @property
    def latest(self) -> Snapshot | None: ...

    @property
    def presence(self) -> Mapping[str, GpuPresence]: ...

    @property
    def kernel_log(self) -> KernelLogStats | None: ...  # None: the kernel-log source is off

    @property
    def recent_xids(self) -> deque[XidEvent]: ...

    @property
    def docks(self) -> tuple[DockSample, ...]: ...

    @property
    def gpu_docks(self) -> Mapping[str, DockSample]: ...  # GPU uuid -> the dock it was last seen behind

    def gpu_history(self, uuid: str, since: float | None = None) -> Sequence[GpuPoint]: ...

    def process_history(self, uuid: str, pid: int) -> Sequence[ProcessPoint]: ...

    def process_keys(self) -> Sequence[tuple[str, int]]: ...

    def process_owner(self, uuid: str, pid: int) -> ProcessOwner | None: ...  # sources/attribution


def owner_labels(view: RuleView, uuid: str, pid: int) -> dict[str, str]:
    """The known owner labels of a GPU process (container_id, namespace, pod, container, hpc_job), so an
    Alertmanager route can send a process alert to the team owning the namespace; {} for a host process. A
    condition carries them as ``attribution`` (never as identity ``labels``) and in its ``annotations`` (current)."""
    owner = view.process_owner(uuid, pid)
    return owner.labels() if owner is not None else {}


def owner_phrase(view: RuleView, uuid: str, pid: int) -> str:
    """The phrase " in pod ns/pod container c" (or container, job) after ``name[pid]`` in a message; "" when unknown."""
    owner = view.process_owner(uuid, pid)
    return owner.describe() if owner is not None else ""


def gpu_labels(view: RuleView, uuid: str) -> dict[str, str]:
    """``uuid``, ``gpu`` (index) and ``model`` of a GPU, from presence (so a lost/removed GPU keeps them)."""
    pres = view.presence.get(uuid)
    if pres is not None:
        ident = pres.identity
        labels = {"uuid": uuid, "gpu": str(ident.index), "model": ident.name or "unknown"}
        if ident.parent_uuid is not None:  # a MIG device (its name says the profile): which GPU it is part of
            labels["parent_uuid"] = ident.parent_uuid
        return labels
    if view.latest is not None:
        for g in view.latest.gpus:
            if g.uuid == uuid:
                return {"uuid": uuid, "gpu": str(g.index), "model": g.name or "unknown"}
    return {"uuid": uuid, "gpu": "", "model": "unknown"}


def gpu_title(labels: Mapping[str, str]) -> str:
    """``GPU 0 (NVIDIA A10G)``, the start of every per-GPU summary."""
    gpu = labels.get("gpu", "")
    head = f"GPU {gpu}" if gpu else f"GPU {labels.get('uuid', '?')}"
    model = labels.get("model")
    return f"{head} ({model})" if model and model != "unknown" else head


@functools.lru_cache(maxsize=4096)
def fmt_bytes(n: float) -> str:
    """Binary units with one decimal: ``38.2 MiB``, ``18.1 GiB``. Memoized: the rules format every process'
    memory at every evaluation, mostly the same amounts."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_gpu_memory(g: GpuSample, lead: str) -> str:
    """``lead`` and the GPU's memory in use, ``18.1/24.0 GiB used``; empty when NVML did not say."""
    if g.memory_used_bytes is None or g.memory_total_bytes is None:
        return ""
    gib = 1024**3
    return f"{lead}{g.memory_used_bytes / gib:.1f}/{g.memory_total_bytes / gib:.1f} GiB used"


def fmt_duration(seconds: float) -> str:
    """Coarse human duration: ``45s``, ``12m``, ``1h42m``, ``3d4h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    m, _ = divmod(s, 60)
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h}h"


def fmt_share(x: float) -> str:
    return f"{round(x * 100)}%"
