"""What the kernel-log source has seen, as the exporter shows it (exporter/kernel_log_families.py).

A value type of the model, so the store can hold it without importing the source (sources/kmsg/ingest.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The `kind` label of gpuwatchd_kernel_log_lines_total: every line is counted under one of these
# (sources/kmsg/parse.py classifies a line).
KINDS = (
    "xid", "sxid", "gpu_address", "fallen_off_bus", "rm_init_failed", "version_mismatch", "driver_loaded", "aer",
    "pciehp", "thunderbolt", "other", "malformed",
)


@dataclass
class KernelLogStats:
    """Counters and facts the exporter reads (exporter/kernel_log_families.py)."""

    up: bool = False
    error: str | None = None
    lines: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    records_lost: int = 0
    records_cut: int = 0  # records longer than the reader's limit, cut to it
    fallen_off_bus: dict[str, int] = field(default_factory=dict)  # uuid -> count
    aer: dict[tuple[str, str], int] = field(default_factory=dict)  # (uuid, severity) -> count
    xid_reports: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (uuid, xid, source) -> count
    # NVSwitch SXid errors: (switch PCI address, sxid) -> count, all and the fatal ones
    sxid: dict[tuple[str, str], int] = field(default_factory=dict)
    sxid_fatal: dict[tuple[str, str], int] = field(default_factory=dict)
    # switch -> when its last SXid / last fatal SXid was logged (rules/nvswitch.py)
    sxid_last: dict[str, float] = field(default_factory=dict)
    sxid_fatal_last: dict[str, float] = field(default_factory=dict)
    last_seq: int | None = None
    driver_version: str | None = None
    version_mismatch: str | None = None
