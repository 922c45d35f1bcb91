"""``GpuDockUnauthorized`` (a Thunderbolt dock is attached but has no PCIe tunnel) and ``GpuDockLinkDegraded``
(its link trained below what its generation gives).

Read from ``view.docks`` (``sources/sysfs/thunderbolt.py``). A dock detaching raises nothing here: the GpuRemoved of
the GPU behind it names the dock (``rules/presence.py``), so the user gets one message about the unplug.
"""

from __future__ import annotations

from gpuwatchd.model import DockSample
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig

UNAUTHORIZED = "GpuDockUnauthorized"
LINK_DEGRADED = "GpuDockLinkDegraded"

# What a healthy link trains at, per lane and in lanes, by Thunderbolt generation (sysfs ``generation``): TB1 one
# 10 Gb/s lane, TB2 two bonded 10 Gb/s lanes, TB3 and USB4 40G two 20 Gb/s lanes (USB4 v2 / TB5 reports
# generation 4 too and trains faster, so its 2 x 20 is a floor, not a ceiling).
EXPECTED_LINK: dict[int, tuple[float, int]] = {1: (10e9, 1), 2: (10e9, 2), 3: (20e9, 2), 4: (20e9, 2)}

# Security levels at which no PCIe tunnel is ever made, whatever the user authorizes (admin-guide/thunderbolt.rst).
NO_PCIE_LEVELS = set(advice.NO_PCIE_LEVELS)

UNAUTHORIZED_DESCRIPTION = (
    "The Thunderbolt security level asks for devices to be approved, and this one is not: the kernel made no PCIe "
    "tunnel to it, so the GPU in it cannot appear (the 'dock not recognised' symptom). At 'dponly'/'usbonly' no "
    "PCIe tunnel is ever made, whatever is approved."
)
LINK_DESCRIPTION = (
    "The Thunderbolt link to this dock trained with fewer lanes or a lower lane speed than its generation "
    "gives (2 x 20 Gb/s for Thunderbolt 3/4 and USB4 40G), so the GPU behind it gets a fraction of the "
    "bandwidth."
)


def dock_labels(d: DockSample) -> dict[str, str]:
    """``unique_id`` and ``dock`` (vendor and name, as boltctl lists them)."""
    return {"unique_id": d.unique_id, "dock": dock_title(d)}


def dock_title(d: DockSample) -> str:
    """``Razer Core X`` (or the route when the device has no name)."""
    name = " ".join(p for p in (d.vendor, d.name) if p)
    return name or f"Thunderbolt device {d.route}"


def _gbps(bps: float) -> str:
    return f"{bps / 1e9:g} Gb/s"


def link_shortfall(d: DockSample) -> str | None:
    """``"1 x 20 Gb/s (rx), ..."`` when the link trained below its generation, else None."""
    if d.generation is None:
        return None
    speed, lanes = EXPECTED_LINK.get(d.generation, EXPECTED_LINK[max(EXPECTED_LINK)])
    low: list[str] = []
    for direction, s, n in (("rx", d.rx_speed_bps, d.rx_lanes), ("tx", d.tx_speed_bps, d.tx_lanes)):
        if (s is not None and s < speed) or (n is not None and n < lanes):
            low.append(f"{direction} {n if n is not None else '?'} x {_gbps(s) if s is not None else '?'}")
    if not low:
        return None
    return f"{', '.join(low)} of {lanes} x {_gbps(speed)}"


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Unauthorized docks and docks whose link trained low."""
    out: list[Condition] = []
    for d in view.docks:
        labels = dock_labels(d)
        title = dock_title(d)
        if d.authorized is False:
            level = d.security or "unknown"
            why = (
                f"the BIOS security level is '{level}', which never makes a PCIe tunnel"
                if level in NO_PCIE_LEVELS
                else f"security level '{level}'"
            )
            out.append(
                Condition(
                    UNAUTHORIZED,
                    "warning",
                    labels,
                    f"Thunderbolt dock {title} ({d.route}) is attached but not authorized, so the GPU behind it "
                    f"cannot appear ({why})",
                    UNAUTHORIZED_DESCRIPTION,
                    value=0.0,
                    annotations={advice.ACTION: advice.dock_unauthorized(d.unique_id, d.security)},
                )
            )
        elif d.authorized:
            behind = f", and {len(d.gpu_bus_ids)} GPU(s) behind it" if d.gpu_bus_ids else ""
            out.append(
                Condition(
                    UNAUTHORIZED, "warning", labels, f"Thunderbolt dock {title} ({d.route}) is authorized{behind}",
                    "The dock's PCIe tunnel is up; the GPU in it can be used.", level="clear",
                )
            )
        low = link_shortfall(d) if d.authorized is not False else None
        if low is None and d.generation is not None:
            out.append(
                Condition(
                    LINK_DEGRADED, "warning", labels,
                    f"Thunderbolt dock {title} ({d.route}): link at full width and speed",
                    "The link trains as its generation gives.", level="clear",
                )
            )
        if low is not None:
            gen = "USB4" if d.generation == 4 else f"Thunderbolt {d.generation}"
            out.append(
                Condition(
                    LINK_DEGRADED,
                    "warning",
                    labels,
                    f"Thunderbolt dock {title} ({d.route}): {gen} link trained at {low}",
                    LINK_DESCRIPTION,
                    annotations={advice.ACTION: advice.DOCK_LINK},
                    value=float(min(n for n in (d.rx_lanes, d.tx_lanes) if n is not None))
                    if d.rx_lanes is not None or d.tx_lanes is not None
                    else None,
                )
            )
    return out
