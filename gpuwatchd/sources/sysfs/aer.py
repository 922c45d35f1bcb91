"""A PCIe device's AER error counters from sysfs: ``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``.

The kernel's AER driver (drivers/pci/pcie/aer.c, since 4.19; Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats)
counts the error messages a device reported since boot, one ``Name count`` line per error bit and a last line with
the total: ``TOTAL_ERR_COR``, ``TOTAL_ERR_NONFATAL``, ``TOTAL_ERR_FATAL``. Correctable errors are repaired by the
link (a replay) and cost bandwidth; non-fatal ones lose a transaction; fatal ones take the link down. A device
without AER (or a kernel without the stats) has no such files: None, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuwatchd.sources.sysfs.pcie import ATTR_MAX_BYTES

FILES = {"correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
         "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
         "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL")}


@dataclass(frozen=True, slots=True)
class AerCounts:
    """Totals per severity since boot, and the error names with a non-zero count (``BadTLP``, ``RxErr``, ...)."""

    correctable: int
    nonfatal: int
    fatal: int
    names: dict[str, dict[str, int]] = field(default_factory=dict)  # severity -> name -> count (non-zero only)


def parse(text: str) -> dict[str, int]:
    """``"RxErr 0\\nBadTLP 3\\nTOTAL_ERR_COR 3\\n"`` -> {"RxErr": 0, "BadTLP": 3, "TOTAL_ERR_COR": 3}; lines that are
    not a name and a count are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_aer(device_dir: Path) -> AerCounts | None:
    """The AER counters under ``/sys/bus/pci/devices/<bdf>``; None where the device has none (or one is
    unreadable: a partial answer would read as "no fatal errors")."""
    totals: dict[str, int] = {}
    names: dict[str, dict[str, int]] = {}
    for severity, (fname, total_key) in FILES.items():
        try:
            with open(device_dir / fname, "rb") as f:
                counts = parse(f.read(ATTR_MAX_BYTES).decode("ascii", "replace"))
        except OSError:
            return None
        total = counts.pop(total_key, None)
        if total is None:
            total = sum(counts.values())
        totals[severity] = total
        nonzero = {k: v for k, v in counts.items() if v}
        if nonzero:
            names[severity] = nonzero
    return AerCounts(totals["correctable"], totals["nonfatal"], totals["fatal"], names)
