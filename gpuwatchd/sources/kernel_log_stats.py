"""What the kernel-log source has seen, as the exporter shows it (exporter/kernel_log_families.py).

Kept apart from the source itself so the store can hold it without importing the source (the source imports the
store).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatchd.sources.kmsg_parse import KINDS


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
    last_seq: int | None = None
    driver_version: str | None = None
    version_mismatch: str | None = None
