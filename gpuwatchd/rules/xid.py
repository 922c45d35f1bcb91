"""``GpuXidError``: one alert per (GPU, Xid code), from ``store.recent_xids``.

An Xid is an event, not a level: the alert fires at the first event (``for: 0``) and its condition holds until
``rules.xid.resolve_after`` has passed without a repeat; repeats within that time update the count in the same
alert instead of starting new ones. The condition is recomputed from the recent events on every evaluation
(no cursor), so NVML events and kernel-log events (``Store.ingest``, a later source) take the same path and a
daemon restart cannot replay old ones as new. Per-code counters are exported from the store by the exporter
(``gpuwatchd_gpu_xid_errors_total{uuid,xid}``), never as a sticky last-value gauge.

Severity and, for codes without gpuwatchd's own wording below, the message come from NVIDIA's whole Xid catalog
("Analyzing Xid Errors with the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
carried as data in gpuwatchd/gpu/xid_catalog.json: critical when its immediate action is a GPU reset or a reboot,
info when NVIDIA says to ignore it, warning otherwise; a code the catalog does not know is a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.model import Severity, XidEvent
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, RuleView, fmt_duration, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuXidError"

# GPUs NVML has not listed (a UUID only the kernel log names: forged, or gone before the first poll) named in alerts
# of their own at once. A host has at most a few dozen GPUs and NVML lists them; a kernel log naming 30k UUIDs made
# 30k alerts (a 25 MB /api/v1/alerts, /healthz slow while they were built). Past this many, the unlisted ones are one
# "unknown" GPU in the alerts (the counters and recent_xids keep their UUIDs, capped on their own).
MAX_UNLISTED_GPUS = 8
# GpuXidError alerts at once: 16 GPUs with a few codes each fit. The (GPU, code) pairs past this (listed GPUs first)
# are one summarising alert, ``xid="other"``, whose value is the number of pairs it stands for.
MAX_XID_ALERTS = 64
OTHER = "other"
_RANK = {"info": 0, "warning": 1, "critical": 2}

# Application-level codes: once is the job's bug (docs/alerts.md); rules/xid_repeat.py escalates repeats.
APPLICATION = frozenset({13, 31, 43, 45, 68, 94})
FALLEN_OFF_BUS = 79
# The loss follows an Xid 79 within a poll or two (NVML) and the docked GPU's settle (rules/presence.py); past
# this, an Xid 79 without a lost GPU is news of its own.
FALLEN_OFF_HOLD_SECONDS = 15.0

@dataclass(frozen=True, slots=True)
class XidInfo:
    mnemonic: str
    meaning: str


# gpuwatchd's own words for what the common codes mean; what to do about each is in rules/advice.py.
CATALOG: dict[int, XidInfo] = {
    8: XidInfo("FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing"),
    13: XidInfo("GR_EXCEPTION", "graphics engine exception (usually an out-of-bounds access in the app)"),
    31: XidInfo("FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (illegal address, usually an app bug)"),
    32: XidInfo("PBDMA_ERROR", "invalid or corrupted push buffer stream (often PCIe signal quality)"),
    43: XidInfo("RESETCHANNEL_VERIF_ERROR", "the app hit a software-induced fault; the GPU stays healthy"),
    45: XidInfo("PREEMPTIVE_REMOVAL", "channels cleaned up after a kill, Ctrl-C, reset or an earlier error"),
    48: XidInfo("GPU_ECC_DBE", "uncorrectable double-bit ECC error"),
    54: XidInfo("PWR_REDUCED_CLOCKING", "auxiliary power not connected"),
    62: XidInfo("PMU_HALT_ERROR", "internal micro-controller halt"),
    63: XidInfo("INFOROM_DRAM_RETIREMENT_EVENT", "memory row remap / page retirement recorded (ECC handled it)"),
    64: XidInfo("INFOROM_DRAM_RETIREMENT_FAILURE", "memory remap/retirement failed"),
    68: XidInfo("NVDEC0_ERROR", "video decoder exception"),
    74: XidInfo("NVLINK_ERROR", "NVLink error (may be the remote GPU's fault)"),
    79: XidInfo("GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus (PCIe link lost)"),
    92: XidInfo("EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate"),
    94: XidInfo("CONTAINED_ERROR", "contained memory error: only the affected application was hit"),
    95: XidInfo("UNCONTAINED_ERROR", "uncontained memory error affecting several applications"),
    109: XidInfo("CTXSW_TIMEOUT_ERROR", "context switch timeout"),
    119: XidInfo("GSP_RPC_TIMEOUT", "GSP firmware RPC timeout"),
    120: XidInfo("GSP_ERROR", "GSP firmware error"),
    140: XidInfo("UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error"),
    143: XidInfo("GPU_INIT_ERROR", "GPU initialization error"),
    154: XidInfo("GPU_RECOVERY_ACTION_CHANGED", "the driver changed the GPU's recovery action"),
}


def severity(code: int) -> Severity:
    """Severity of an Xid code from the catalog (gpuwatchd/gpu/xid_catalog.json); unknown codes are warnings."""
    e = xid_catalog.entry(code)
    return e.severity if e is not None else "warning"


def _short(mnemonic: str) -> str:
    return " / ".join(m.strip().removeprefix("ROBUST_CHANNEL_") for m in mnemonic.split("/"))


def meaning(code: int) -> str:
    """What a code means: gpuwatchd's own words for the common codes, NVIDIA's catalog for the others, a generic
    answer for codes in neither."""
    info = CATALOG.get(code)
    if info is not None:
        return f"{info.mnemonic}: {info.meaning}"
    e = xid_catalog.entry(code)
    if e is not None:
        desc = e.description
        what = ("a code NVIDIA's catalog marks unused on Ampere and newer GPUs" if e.unused
                else desc[0].lower() + desc[1:] if desc[1:2].islower() else desc or "no description")
        return f"{_short(e.mnemonic)}: {what}"
    return "an Xid this daemon has no catalog entry for"


def describe(code: int) -> tuple[str, str]:
    """(meaning, what to do) for a code with no evidence about the GPU (rules/advice.py's ``xid``)."""
    return meaning(code), advice.xid(code)


def _uuid_for(view: RuleView, ev: XidEvent) -> str | None:
    if ev.uuid is not None:
        return ev.uuid
    if ev.pci_bus_id is None:
        return None
    # Kernel-log Xids carry a PCI id without function ("0000:06:00"); NVML's form is "00000000:06:00.0".
    want = _bdf(ev.pci_bus_id)
    if want is None:
        return None
    for uuid, pres in view.presence.items():
        if pres.identity.pci_bus_id is not None and _bdf(pres.identity.pci_bus_id) == want:
            return uuid
    return None


def gpu_resolver(view: RuleView, events: Iterable[XidEvent]) -> Callable[[XidEvent], str | None]:
    """:func:`_uuid_for`, with the GPUs NVML has not listed seen as unknown (None) once ``events`` name more than
    :data:`MAX_UNLISTED_GPUS` of them."""
    unlisted: set[str] = set()
    for ev in events:
        if ev.uuid is not None and ev.uuid not in view.presence:
            unlisted.add(ev.uuid)
            if len(unlisted) > MAX_UNLISTED_GPUS:
                break
    fold = len(unlisted) > MAX_UNLISTED_GPUS

    def resolve(ev: XidEvent) -> str | None:
        uuid = _uuid_for(view, ev)
        return None if fold and uuid is not None and uuid not in view.presence else uuid

    return resolve


def reattached_since(view: RuleView, uuid: str, t: float) -> bool:
    """The GPU went away (lost or removed) after ``t`` and is present again: it has been reset or re-plugged."""
    pres = view.presence.get(uuid)
    return (
        pres is not None
        and pres.state == "present"
        and pres.first_seen is not None
        and pres.since > pres.first_seen  # it has been away at least once...
        and pres.since > t  # ...and came back after the Xid
    )


def _bdf(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of ``PCI:0000:06:00``, ``0000:06:00.0`` or ``00000000:06:00.0``; None if unparsable."""
    parts = text.strip().lower().removeprefix("pci:").rsplit(".", 1)[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per (GPU, code) with an event within ``resolve_after``."""
    cfg = config.xid
    recent = [ev for ev in view.recent_xids
              if ev.xid not in cfg.ignore and now - cfg.resolve_after < ev.timestamp <= now]
    uuid_of = gpu_resolver(view, recent)
    groups: dict[tuple[str | None, int], list[XidEvent]] = {}
    for ev in recent:
        groups.setdefault((uuid_of(ev), ev.xid), []).append(ev)
    # Listed GPUs first, so that a flood of unknown ones is what the summarising alert stands for.
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0] not in view.presence, kv[0][0] or "", kv[0][1]))
    folded = ordered[MAX_XID_ALERTS - 1:] if len(ordered) > MAX_XID_ALERTS else []
    out: list[Condition] = [_summary(folded, now)] if folded else []
    for (uuid, code), events in ordered[: len(ordered) - len(folded)]:
        if uuid is not None:
            labels = gpu_labels(view, uuid)
            title = gpu_title(labels)
        else:
            bus = events[-1].pci_bus_id
            labels = {"uuid": "unknown", "gpu": "", "model": "unknown"}
            title = f"GPU at PCI {bus}" if bus else "unknown GPU"
        what = meaning(code)
        last = events[-1]
        if uuid is not None and severity(code) == "critical" and reattached_since(view, uuid, last.timestamp):
            # A reset-class or link Xid asks for a GPU reset, a re-plug or a reboot; a GPU that has been
            # re-enumerated since the last one has had exactly that. Saying "reboot" after an eGPU came back
            # would be noise; the resolution says why it ended.
            pres = view.presence[uuid]
            out.append(
                Condition(
                    NAME,
                    severity(code),
                    {**labels, "xid": str(code)},
                    f"{title}: Xid {code} ({what}) cleared: the GPU was re-attached or reset "
                    f"(present again since {fmt_duration(now - pres.since)} ago)",
                    "The GPU answers again after a re-enumeration.",
                    level="clear", annotations={advice.ACTION: advice.XID_REATTACHED},
                )
            )
            continue
        count = len(events)
        times = f"{count} times in the last {fmt_duration(now - events[0].timestamp)}" if count > 1 else "once"
        detail = f" — {last.message}" if last.message else ""
        out.append(
            Condition(
                NAME,
                severity(code),
                {**labels, "xid": str(code)},
                f"{title}: Xid {code} ({what}) {times}{detail}",
                f"Resolves after {fmt_duration(cfg.resolve_after)} without a repeat.",
                value=float(count),
                annotations={"source": last.source, "last_seen": f"{last.timestamp:.3f}",
                             advice.ACTION: advice.xid(code, egpu=uuid is not None and uuid in view.gpu_docks,
                                                       index=labels.get("gpu"))},
                # Xid 79 is the fall off the bus that GpuLost/GpuRemoved speak for (they inhibit this alert): held
                # long enough for them to fire, it alerts on its own only when the GPU did not go away.
                hold_for=max(FALLEN_OFF_HOLD_SECONDS, cfg.for_) if code == FALLEN_OFF_BUS else None,
            )
        )
    return out


def _summary(folded: list[tuple[tuple[str | None, int], list[XidEvent]]], now: float) -> Condition:
    """The one alert standing for the (GPU, code) pairs past :data:`MAX_XID_ALERTS`."""
    codes = sorted({code for (_, code), _ in folded})
    gpus = len({uuid for (uuid, _), _ in folded})
    sev = max((severity(c) for c in codes), key=lambda s: _RANK[s])
    first = min(ev.timestamp for _, events in folded for ev in events)
    shown = ", ".join(str(c) for c in codes[:10]) + (f" and {len(codes) - 10} more" if len(codes) > 10 else "")
    return Condition(
        NAME,
        sev,
        {"uuid": "unknown", "gpu": "", "model": "unknown", "xid": OTHER},
        f"{len(folded)} more (GPU, Xid) pairs than get alerts of their own ({MAX_XID_ALERTS}) in the last "
        f"{fmt_duration(now - first)}: Xid {shown} on {gpus} GPU(s)",
        "More distinct GPU and Xid pairs than a host has: read the kernel log (and /api/v1/status recent_xids) for "
        "what reported them; a kernel log naming GPUs NVML does not list may be forged. Resolves with the pairs.",
        value=float(len(folded)),
    )
