"""``GpuLost`` (critical: answers GPU_IS_LOST / fell off the bus), ``GpuRemoved`` (warning: gone from
enumeration, e.g. an eGPU dock detached) and ``GpuCountLow`` (fewer GPUs present than expected).

All read ``store.presence``, which the store keeps per UUID after a GPU goes away, so the alert still names
the GPU. When a GPU is present again the family returns a ``clear`` note, which becomes the resolution message
("reattached at index N"); the index may differ from before (eGPUs re-enumerate), which is why the engine
matches such notes by alertname and uuid.
"""

from __future__ import annotations

import time
from functools import lru_cache

from gpuwatchd.model import DockSample, GpuIdentity, GpuPresence
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.dock import dock_title

LOST = "GpuLost"
REMOVED = "GpuRemoved"
COUNT_LOW = "GpuCountLow"

# One disappearance is one incident and reaches chat as one alert, whose name and advice follow the evidence
# (docs/alerts.md "One incident, one message"):
#   the GPU's Thunderbolt dock was detached (cable pulled, enclosure switched off) -> GpuRemoved: re-plug it;
#   the GPU fell off the bus while its dock stayed attached -> GpuLost: cable and enclosure PSU, then reboot;
#   a GPU without a dock fell off the bus -> GpuLost: reboot;
#   a GPU without a dock left the enumeration (unbound, hot-removed) -> GpuRemoved.
# A docked GPU that stops answering is held DOCK_SETTLE_SECONDS before GpuLost fires: a cable pull takes the dock
# off the Thunderbolt bus in the same instant, and the dock watch (one read per poll interval) must get to see it,
# or the user would read "reboot" and then "re-plug" about one pull of the cable.
DOCK_SETTLE_SECONDS = 5.0

LOST_DESCRIPTION = (
    "The GPU stopped answering (NVML GPU_IS_LOST; the kernel log usually shows Xid 79 'fallen off the bus'). "
    "Jobs on it have failed."
)
LOST_DOCKED_DESCRIPTION = (
    "The GPU fell off the bus while its Thunderbolt dock stayed attached: the PCIe tunnel or the GPU's power "
    "failed, not the plug. Jobs on it have failed."
)
REMOVED_DESCRIPTION = (
    "The GPU is no longer enumerated by the driver: the device was unbound or hot-removed, or it dropped off the "
    "bus. Re-attaching it resolves this alert."
)
DETACHED_DESCRIPTION = (
    "The GPU went with its Thunderbolt dock: the cable was pulled or the enclosure lost power. Jobs on it have "
    "failed. Re-attaching resolves this alert."
)
COUNT_DESCRIPTION = "Fewer GPUs are present than rules.expected_gpu_count."


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _present_note(name: str, pres: GpuPresence, labels: dict[str, str], view: RuleView) -> Condition:
    # The resolution keeps the labels the alert fired with (its header names the index it had then): the body names
    # the GPU by model and uuid, and says where it is now, so header and body never contradict each other.
    return _note(name, pres.identity, pres.since, tuple(labels.items()), view.gpu_docks.get(pres.identity.uuid))


# Two notes per present GPU at every evaluation, the same until the GPU's identity, presence or dock changes: made
# once (a condition is immutable; the engine copies its labels).
@lru_cache(maxsize=1024)
def _note(name: str, ident: GpuIdentity, since: float, labels: tuple[tuple[str, str], ...],
          d: DockSample | None) -> Condition:
    model = dict(labels).get("model") or "the GPU"
    where = f"now at index {ident.index}" + (f", PCI {ident.pci_bus_id}" if ident.pci_bus_id else "")
    dock = f", behind its dock {dock_title(d)} ({d.unique_id})" if d is not None else ""
    return Condition(
        name,
        "critical" if name == LOST else "warning",
        dict(labels),
        f"{model} ({ident.uuid}) is back since {_clock(since)}: {where}{dock}",
        "The GPU is present again.",
        level="clear", annotations={advice.ACTION: advice.BACK},
    )


def _dock(view: RuleView, uuid: str) -> tuple[DockSample | None, bool]:
    """The Thunderbolt dock the GPU is (or was last) behind, and whether that dock is attached now."""
    d = view.gpu_docks.get(uuid)
    if d is None:
        return None, False
    return d, any(a.unique_id == d.unique_id for a in view.docks)


def _missing(view: RuleView, uuid: str, pres: GpuPresence, labels: dict[str, str]) -> list[Condition]:
    """The one alert about a GPU that is not present, chosen by the evidence (see DOCK_SETTLE_SECONDS)."""
    title = gpu_title(labels)
    d, attached = _dock(view, uuid)
    bus = f" at PCI {pres.identity.pci_bus_id}" if pres.identity.pci_bus_id else ""
    what = "stopped answering (fell off the bus)" if pres.state == "lost" else "no longer enumerated"
    fell = pres.lost_since if pres.lost_since is not None else pres.since
    if d is not None and (not attached or pres.dock_left):  # sticky: the dock may be back before the GPU is
        name = dock_title(d)
        return [
            Condition(
                REMOVED, "warning", labels,
                f"{title}{bus}: its Thunderbolt dock {name} ({d.unique_id}) was detached; the GPU {what} since "
                f"{_clock(pres.since)}",
                DETACHED_DESCRIPTION, value=pres.since,
                annotations={"dock": name, advice.ACTION: advice.REPLUG_DOCK},
            ),
            Condition(LOST, "critical", labels, f"{title}: went with its dock (see GpuRemoved)", LOST_DESCRIPTION,
                      level="clear"),
        ]
    if pres.state == "lost" or pres.lost_since is not None:
        # Fell off the bus; a GPU that then also leaves the enumeration (a fresh NVML session no longer lists it)
        # is still that one incident.
        if d is not None:
            name = dock_title(d)
            return [
                Condition(
                    LOST, "critical", labels,
                    f"{title}{bus}: fell off the bus since {_clock(fell)} (last answered "
                    f"{_clock(pres.last_seen)}) while its Thunderbolt dock {name} ({d.unique_id}) stayed attached",
                    LOST_DOCKED_DESCRIPTION, value=fell,
                    annotations={"dock": name, advice.ACTION: advice.LOST_DOCKED},
                    hold_for=DOCK_SETTLE_SECONDS,
                )
            ]
        return [
            Condition(
                LOST, "critical", labels,
                f"{title}{bus}: lost (fell off the bus) since {_clock(fell)}, last answered "
                f"{_clock(pres.last_seen)}",
                LOST_DESCRIPTION, value=fell, annotations={advice.ACTION: advice.LOST},
            )
        ]
    return [
        Condition(
            REMOVED, "warning", labels,
            f"{title}{bus}: removed (no longer enumerated) since {_clock(pres.since)}",
            REMOVED_DESCRIPTION, value=pres.since, annotations={advice.ACTION: advice.REMOVED},
        ),
        Condition(LOST, "critical", labels, f"{title}: no longer enumerated (see GpuRemoved)", LOST_DESCRIPTION,
                  level="clear"),
    ]


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
            out.append(_present_note(LOST, pres, labels, view))
            out.append(_present_note(REMOVED, pres, labels, view))
        else:
            missing.append(f"{title} {pres.state}")
            out.extend(_missing(view, uuid, pres, labels))
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
