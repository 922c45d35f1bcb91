"""Per GPU: PCIe link vs its maximum (a downshift is normal when idle), the Thunderbolt dock it sits behind, pending
row remaps / retired pages, recent Xids, power limit vs the board default, clock-event reasons that hurt now."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.kernel_log import KernelLog
from gpuwatchd.doctor.report import Result, fail, ok, warn
from gpuwatchd.gpu.clock_events import THROTTLE_REASONS, decode
from gpuwatchd.model import DockSample
from gpuwatchd.rules.dock import link_shortfall
from gpuwatchd.rules.xid import describe, severity
from gpuwatchd.sources.kmsg.parse import normalize_pci
from gpuwatchd.sources.sysfs.thunderbolt import read_docks

# A GPU under this utilization may train its link down to save power (rules/link.py uses the same 50 %).
BUSY_UTILIZATION = 50
# A limit this far under the board default is a deliberate cap (or a dock's PSU profile), not rounding.
POWER_LIMIT_SHORTFALL = 0.95
REASON_FIX = {
    "hw_power_brake": "the board's external power brake is asserted: the PSU (an eGPU enclosure's, often) cannot "
    "carry the card's peaks; use a stronger PSU or lower the power limit (`sudo nvidia-smi -pl W`)",
    "hw_slowdown": "HW slowdown (heat or power delivery): check fans, airflow and the power cables",
    "hw_thermal": "the GPU is too hot: check fans, airflow and dust; a reseated cooler or new paste may be needed",
    "sw_thermal": "the driver slows the GPU for heat: improve cooling or lower the power limit",
}


def check_gpu(
    g: dict[str, Any], docks: Sequence[DockSample], xids: Sequence[dict[str, Any]] | None,
    klog: KernelLog | None = None,
) -> list[Result]:
    grp = f"gpu {g['index']}"
    if g.get("error"):
        return [fail(
            grp, "readable", f"NVML cannot open it: {g['error']}",
            "look for Xid 79 ('fallen off the bus') in `sudo dmesg`; reseat the card or re-plug the eGPU, then reboot",
        )]  # fmt: skip
    return [
        _link(grp, g),
        _dock(grp, g, docks),
        _memory(grp, g),
        *_xids(grp, g, xids, klog),
        _power(grp, g),
        _reasons(grp, g),
    ]


def _link(grp: str, g: dict[str, Any]) -> Result:
    vals = [g.get(k) for k in ("pcie_gen", "pcie_max_gen", "pcie_width", "pcie_max_width")]
    if any(v is None for v in vals):
        return ok(grp, "PCIe link", "not reported by this GPU")
    gen, mgen, w, mw = (int(v) for v in vals)  # type: ignore[arg-type]
    text = f"gen{gen} x{w} of gen{mgen} x{mw}"
    if gen >= mgen and w >= mw:
        return ok(grp, "PCIe link", f"{text} (at its maximum)")
    util = g.get("utilization_gpu")
    if util is None or util < BUSY_UTILIZATION:
        return ok(grp, "PCIe link", f"{text}, GPU idle ({util if util is not None else '?'}% busy): a downshift to "
                  "save power is normal")  # fmt: skip
    return warn(
        grp, "PCIe link", f"{text} while {util}% busy",
        "reseat the card or riser and check the slot's lane setting in the BIOS; on an eGPU, the Thunderbolt "
        "tunnel caps at gen3 x4",
    )  # fmt: skip


def _dock(grp: str, g: dict[str, Any], docks: Sequence[DockSample]) -> Result:
    bus = g.get("pci_bus_id")
    d = next((d for d in docks if bus in d.gpu_bus_ids), None)
    if d is None:
        return ok(grp, "Thunderbolt", "not behind a Thunderbolt dock")
    name = " ".join(p for p in (d.vendor, d.name) if p) or d.route
    low = link_shortfall(d)
    if low is not None:
        return warn(
            grp, "Thunderbolt", f"dock {name} ({d.unique_id}): link trained at {low}",
            "use a certified 40 Gb/s Thunderbolt cable (passive ones over 0.8 m run at 20 Gb/s), plug it straight "
            "into a Thunderbolt port of the host, then re-plug the dock",
        )  # fmt: skip
    return ok(grp, "Thunderbolt", f"dock {name} ({d.unique_id}) authorized, link at full width and speed")


def _memory(grp: str, g: dict[str, Any]) -> Result:
    if g.get("remap_failure"):
        return fail(
            grp, "memory", "row remapping failed: the GPU has run out of spare rows",
            "the board needs service (RMA); drain it and contact the vendor",
        )  # fmt: skip
    pending = [w for w, k in (("a row remap", "remap_pending"), ("a page retirement", "retired_pending")) if g.get(k)]
    if pending:
        return warn(
            grp, "memory", f"{' and '.join(pending)} pending: the faulty memory is still in use",
            "reset the GPU when it is idle (`sudo nvidia-smi -r -i N`) or reboot, to apply it",
        )  # fmt: skip
    if g.get("remap_pending") is None and g.get("retired_pending") is None:
        return ok(grp, "memory", "remap/retirement state not reported (no ECC on this board)")
    return ok(grp, "memory", "no row remap or page retirement pending")


def _xids(grp: str, g: dict[str, Any], xids: Sequence[dict[str, Any]] | None, klog: KernelLog | None) -> list[Result]:
    """From the daemon's recent Xid events (NVML events and the kernel log, de-duplicated) when one answers, else
    from the kernel log read here; no line when neither could be read."""
    if xids is None:
        return _xids_from_log(grp, g, klog)
    mine = [x for x in xids if x.get("uuid") == g.get("uuid")]
    if not mine:
        return [ok(grp, "recent Xids", "none")]
    codes = sorted({int(x["xid"]) for x in mine})
    rank = {"critical": 2, "warning": 1, "info": 0}
    worst = max(codes, key=lambda c: rank[severity(c)])
    text = f"Xid {', '.join(map(str, codes))} ({len(mine)} events) since the daemon started"
    # The advice the daemon shows for it everywhere (rules/advice.py), else the Xid's own with no evidence.
    action = next((str(x["action"]) for x in reversed(mine) if int(x["xid"]) == worst and x.get("action")),
                  describe(worst)[1])
    if severity(worst) == "critical":
        return [fail(grp, "recent Xids", text, f"Xid {worst}: {action}")]
    if severity(worst) == "warning":
        return [warn(grp, "recent Xids", text, f"Xid {worst}: {action}")]
    return [ok(grp, "recent Xids", f"{text}, informational only")]


def _xids_from_log(grp: str, g: dict[str, Any], klog: KernelLog | None) -> list[Result]:
    if klog is None:
        return []
    if klog.error is not None:
        return [warn(grp, "recent Xids", "the kernel log could not be read", klog.error)]
    bus = normalize_pci(str(g.get("pci_bus_id") or ""))
    if any(f.pci_bus_id == bus for f in klog.fallen):
        return [fail(
            grp, "recent Xids", f"the kernel log says it fell off the bus ({klog.source})",
            "reboot to recover it; if it recurs check the PCIe slot/riser or the eGPU cable and enclosure power",
        )]  # fmt: skip
    return _xids(grp, g, [{"uuid": g.get("uuid"), "xid": x.code} for x in klog.xids if x.pci_bus_id == bus], None)


def _power(grp: str, g: dict[str, Any]) -> Result:
    lim, dflt = g.get("power_limit_mw"), g.get("power_default_limit_mw")
    if lim is None or dflt is None:
        return ok(grp, "power limit", f"{lim / 1000:.0f} W" if lim is not None else "not reported")
    if lim < dflt * POWER_LIMIT_SHORTFALL:
        return warn(
            grp, "power limit", f"{lim / 1000:.0f} W, below the board default {dflt / 1000:.0f} W (a dock/PSU "
            "profile or `nvidia-smi -pl` lowered it): the GPU runs slower",
            f"if the PSU can carry it, restore it: `sudo nvidia-smi -i N -pl {dflt // 1000}`",
        )  # fmt: skip
    return ok(grp, "power limit", f"{lim / 1000:.0f} W (board default {dflt / 1000:.0f} W)")


def _reasons(grp: str, g: dict[str, Any]) -> Result:
    mask = g.get("clocks_event_reasons")
    if mask is None:
        return ok(grp, "clock events", "not reported")
    bad = [r for r in decode(int(mask)) if r in THROTTLE_REASONS]
    if bad:
        return warn(grp, "clock events", f"slowed down now: {', '.join(bad)}", "; ".join(REASON_FIX[r] for r in bad))
    return ok(grp, "clock events", f"nothing harmful ({', '.join(decode(int(mask))) or 'no reason'})")


def gpu_docks(host: Host, gpus: Sequence[dict[str, Any]]) -> tuple[DockSample, ...]:
    """The Thunderbolt devices under the host's sysfs, tied to the GPUs NVML listed."""
    return read_docks(host.root, [g["pci_bus_id"] for g in gpus if g.get("pci_bus_id")])


def check_docks(docks: Sequence[DockSample]) -> list[Result]:
    """Docks without a GPU to report under: attached but not authorized (the GPU cannot appear)."""
    out: list[Result] = []
    for d in docks:
        if d.authorized is False:
            name = " ".join(p for p in (d.vendor, d.name) if p) or d.route
            bios = d.security in ("dponly", "usbonly")
            out.append(fail(
                "thunderbolt", f"dock {name}", f"attached but not authorized (security level {d.security}): no PCIe "
                "tunnel, so the GPU in it cannot appear",
                "change the BIOS Thunderbolt security level to 'user' or 'none' (this one never tunnels PCIe)" if bios
                else f"`boltctl enroll {d.unique_id}` (or `boltctl authorize {d.unique_id}` for this time only)",
            ))  # fmt: skip
    return out
