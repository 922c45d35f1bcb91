"""NVSwitch SXid errors (the ``nvidia-nvswitch`` driver's ``SXid (PCI:...): <code>, Fatal|Non-fatal, ...`` lines).

Each SXid line states its own severity (``Fatal`` / ``Non-fatal``), and the counters trust the line. The catalog
names the codes seen in public logs, with the text the driver printed for them and where the line was found; an
unknown code is still counted, under its number, with the line's severity.

Sources (real kernel logs): NVIDIA/nvtrust#124 (HGX H100 dmesg, 22013), leptonai/gpud#338 (12028, with the
Fabric Manager user guide's description "egress nonposted PRIV error"), NVIDIA Fabric Manager user guide DU-09883-001
(SXid tables: 11001, 20009, 24007, 12028), NVSentinel syslog tests (20009, 28006, 24007).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SxidInfo:
    name: str
    fatal: bool  # as the Fabric Manager guide classes it; the line's own word wins when counting


SXID_CATALOG: dict[int, SxidInfo] = {
    11001: SxidInfo("ingress invalid command", True),
    12028: SxidInfo("egress non-posted PRIV error", False),
    20009: SxidInfo("RX short error rate", False),
    22013: SxidInfo("Minion link DLREQ interrupt", False),
    24007: SxidInfo("sourcetrack timeout error", True),
    28006: SxidInfo("MC TS crumbstore MCTO", False),
}


def sxid_name(code: int) -> str:
    """The catalog's name of an SXid, or ``SXid <code>`` for one it does not know."""
    info = SXID_CATALOG.get(code)
    return info.name if info is not None else f"SXid {code}"
