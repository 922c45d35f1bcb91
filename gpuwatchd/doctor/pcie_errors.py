"""Per GPU: PCIe errors now, not only the link's width and speed. A marginal cable or riser trains at full speed and
then corrupts packets: the link repairs them by replaying (NVML's replay counter) and the device reports them as
AER errors (sysfs), while every link-state check passes (issue 28: "20 passed" beside a firing GpuPcieReplays).

- **replays**: each GPU's counter read twice, ``nvml_probe.REPLAY_WINDOW_SECONDS`` apart, against DCGM's allowance
  for the link's generation and width (``rules/link.py``, the daemon's ``GpuPcieReplays`` threshold);
- **AER**: the GPU's ``aer_dev_*`` counters (``sources/sysfs/aer.py``) read before and after that window: a fatal
  error since boot fails, a non-fatal one warns, correctable ones warn while they rise; the totals since boot are
  stated either way (a few over weeks of uptime are normal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.report import Result, fail, ok, warn
from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.rules.link import replay_allowance
from gpuwatchd.sources.sysfs.aer import AerCounts, read_aer
from gpuwatchd.sources.sysfs.pcie import PCI_DEVICES, SysfsUnreadable, nvidia_devices

CHECK = "PCIe errors"
FIX = ("the link corrupts packets: reseat the card (or riser); on an eGPU use a short certified Thunderbolt cable "
       "straight into the host's port, not through a hub, and do not flex it at the connector; rising errors often "
       "come before the GPU falls off the bus (Xid 79)")


def read_all(host: Host) -> dict[str, AerCounts]:
    """The AER counters of every NVIDIA GPU function in sysfs that has them, by sysfs bus id (``0000:07:00.0``)."""
    try:
        bdfs = nvidia_devices(host.root)
    except SysfsUnreadable:
        return {}
    out: dict[str, AerCounts] = {}
    for bdf in bdfs:
        counts = read_aer(host.root / PCI_DEVICES / bdf)
        if counts is not None:
            out[bdf] = counts
    return out


def check_pcie_errors(grp: str, g: dict[str, Any], replays: tuple[int, float] | None,
                      aer_before: Mapping[str, AerCounts], aer_after: Mapping[str, AerCounts]) -> Result:
    """One GPU's line. ``replays``: replays counted over the window and its seconds (None: not read)."""
    problems: list[str] = []
    facts: list[str] = []
    level = "pass"
    total = g.get("pcie_replay_counter")
    gen, width = g.get("pcie_gen"), g.get("pcie_width")
    if replays is not None and replays[0] >= 0 and replays[1] > 0:
        n, secs = replays
        if isinstance(gen, int) and isinstance(width, int) and gen > 0 and width > 0:
            per_min = replay_allowance(gen, width, 60.0)
            rate = n * 60.0 / secs
            if n > replay_allowance(gen, width, secs):
                level = "warn"
                problems.append(f"{n} PCIe replays in {secs:.0f} s (~{rate:.0f}/min; a gen{gen} x{width} link "
                                f"allows {per_min:.0f}/min)")
            else:
                facts.append(f"{n} replays in {secs:.0f} s (allowed {per_min:.0f}/min)")
    if isinstance(total, int):
        facts.append(f"{total} replays since the driver loaded")
    bdf = sysfs_bus_id(str(g["pci_bus_id"])) if g.get("pci_bus_id") else None
    after = aer_after.get(bdf) if bdf else None
    before = aer_before.get(bdf) if bdf else None
    if after is not None:
        if after.fatal:
            level = "fail"
            problems.append(f"{after.fatal} fatal PCIe (AER) errors since boot{_names(after, 'fatal')}")
        if after.nonfatal:
            level = "fail" if level == "fail" else "warn"
            problems.append(f"{after.nonfatal} non-fatal PCIe (AER) errors since boot{_names(after, 'nonfatal')}")
        rising = after.correctable - before.correctable if before is not None else 0
        if rising > 0:
            level = "fail" if level == "fail" else "warn"
            problems.append(f"correctable PCIe (AER) errors rising: +{rising} during the check, "
                            f"{after.correctable} since boot{_names(after, 'correctable')}")
        else:
            facts.append(f"AER: {after.correctable} correctable, {after.nonfatal} non-fatal, {after.fatal} fatal "
                         "since boot")
    elif bdf:
        facts.append("no AER counters in sysfs")
    if level == "pass":
        return ok(grp, CHECK, "; ".join(facts) if facts else "not reported by this GPU")
    detail = "; ".join(problems + facts)
    return (fail if level == "fail" else warn)(grp, CHECK, detail, FIX)


def _names(c: AerCounts, severity: str) -> str:
    names = c.names.get(severity)
    if not names:
        return ""
    return " (" + ", ".join(f"{k} {v}" for k, v in sorted(names.items(), key=lambda kv: -kv[1])) + ")"
