"""``GpuLost`` (critical: answers GPU_IS_LOST / fell off the bus), ``GpuRemoved`` (warning: gone from
enumeration, e.g. an eGPU dock detached) and ``GpuCountLow`` (fewer GPUs present than expected).

All read ``store.presence``, which the store keeps per UUID after a GPU goes away, so the alert still names
the GPU. When a GPU is present again the family returns a ``clear`` note, which becomes the resolution message
("reattached at index N"); the index may differ from before (eGPUs re-enumerate), which is why the engine
matches such notes by alertname and uuid.
"""

from __future__ import annotations

import time

from gpuwatchd.model import GpuPresence
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.dock import dock_title

LOST = "GpuLost"
REMOVED = "GpuRemoved"
COUNT_LOW = "GpuCountLow"

LOST_DESCRIPTION = (
    "The GPU stopped answering (NVML GPU_IS_LOST; the kernel log usually shows Xid 79 'fallen off the bus'). "
    "Jobs on it have failed. A reboot is needed to recover it; if it recurs, check the PCIe slot/riser, power "
    "cables and PSU, and the GPU's temperature history. On an eGPU: check the cable and the enclosure's power."
)
REMOVED_DESCRIPTION = (
    "The GPU is no longer enumerated by the driver: an eGPU dock or cable was disconnected, the device was "
    "unbound, or it dropped off the bus. If that was not intended, re-plug the dock (check its power) and look "
    "at the kernel log; re-attaching resolves this alert."
)
COUNT_DESCRIPTION = (
    "Fewer GPUs are present than rules.expected_gpu_count. Check the lost/removed GPUs, the kernel log "
    "(Xid 79, PCIe AER errors) and lspci; a reboot usually brings back a GPU that fell off the bus."
)


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _present_note(name: str, pres: GpuPresence, labels: dict[str, str], now: float) -> Condition:
    verb = "reattached" if name == REMOVED else "answering again"
    return Condition(
        name,
        "critical" if name == LOST else "warning",
        labels,
        f"{gpu_title(labels)}: {verb} at index {pres.identity.index} (back since {_clock(pres.since)})",
        "The GPU is present again; check that its jobs restarted.",
        level="clear",
    )


def _detached_dock(view: RuleView, uuid: str) -> tuple[str, str]:
    """The Thunderbolt dock the GPU was last behind, when that dock is no longer attached: (name, summary note).

    Named in the GpuRemoved message itself (an annotation, not a label: the dock may be read a moment after the
    removal, and a label appearing later would split the alert in two), so a detach reaches chat as one message.
    """
    d = view.gpu_docks.get(uuid)
    if d is None or any(a.unique_id == d.unique_id for a in view.docks):
        return "", ""
    name = dock_title(d)
    return name, f"; its Thunderbolt dock {name} ({d.unique_id}) was detached"


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Lost and removed GPUs, notes for GPUs back, and the count check."""
    out: list[Condition] = []
    present = 0
    missing: list[str] = []
    for uuid, pres in sorted(view.presence.items()):
        if pres.identity.parent_uuid is not None:
            continue  # a MIG device: part of its GPU, whose presence this is about
        labels = gpu_labels(view, uuid)
        title = gpu_title(labels)
        if pres.state == "present":
            present += 1
            out.append(_present_note(LOST, pres, labels, now))
            out.append(_present_note(REMOVED, pres, labels, now))
        elif pres.state == "lost":
            missing.append(f"{title} lost")
            out.append(
                Condition(
                    LOST,
                    "critical",
                    labels,
                    f"{title}: lost (fell off the bus) since {_clock(pres.since)}, "
                    f"last answered {_clock(pres.last_seen)}",
                    LOST_DESCRIPTION,
                    value=pres.since,
                )
            )
        else:
            missing.append(f"{title} removed")
            bus = f" at PCI {pres.identity.pci_bus_id}" if pres.identity.pci_bus_id else ""
            dock, dock_note = _detached_dock(view, uuid)
            out.append(
                Condition(
                    REMOVED,
                    "warning",
                    labels,
                    f"{title}{bus}: removed (no longer enumerated) since {_clock(pres.since)}{dock_note}",
                    REMOVED_DESCRIPTION,
                    value=pres.since,
                    annotations={"dock": dock} if dock else {},
                )
            )
            out.append(
                Condition(
                    LOST, "critical", labels, f"{title}: no longer enumerated (see GpuRemoved)", LOST_DESCRIPTION,
                    level="clear",
                )
            )
    expected = config.expected_gpu_count
    if expected is not None and present < expected and (view.latest is not None or view.presence):
        what = f"; {', '.join(missing)}" if missing else ""
        out.append(
            Condition(
                COUNT_LOW,
                "warning",
                {},
                f"{present} of {expected} expected GPUs present{what}",
                COUNT_DESCRIPTION,
                value=float(present),
            )
        )
    return out
