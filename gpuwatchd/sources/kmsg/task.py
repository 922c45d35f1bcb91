"""The kernel-log source as the daemon runs it: config -> ingest + reader, and the PCI topology from sysfs."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from gpuwatchd.config.kernel_log import KernelLogConfig
from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.model import Snapshot
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest, Topology
from gpuwatchd.sources.kmsg.parse import normalize_pci
from gpuwatchd.sources.kmsg.reader import KmsgReader
from gpuwatchd.sources.sysfs.pcie import PCI_DEVICES
from gpuwatchd.store import Store

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def sysfs_topology(sysfs_root: Path) -> Topology:
    """GPU address -> the PCI ports above it, from where its sysfs directory sits (``devices/pci0000:00/<root
    port>/<switch>/.../<gpu>``). Empty when the device is not in the tree (already gone, or no sysfs)."""

    def ports(address: str) -> list[str]:
        try:
            real = (sysfs_root / PCI_DEVICES / sysfs_bus_id(address)).resolve(strict=True)
        except (OSError, RuntimeError):
            return []
        return [n for p in real.parts[:-1] if _BDF.match(p) and (n := normalize_pci(p)) is not None]

    return ports


class KernelLogTask:
    """Owns the ingest (what records mean) and the reader (where they come from) for one daemon run."""

    def __init__(self, config: KernelLogConfig, store: Store, *, clock: Clock, state_dir: Path, sysfs_root: Path,
                 on_event: Callable[[], None], backlog_horizon: float | None = None) -> None:
        # on_event wakes the rules after each record, so a fall off the bus raises GpuLost without waiting for the
        # next NVML poll.
        self.ingest = KernelLogIngest(store, topology=sysfs_topology(sysfs_root), dedup_window=config.dedup_window,
                                      on_change=on_event)
        self.reader = KmsgReader(config.path, self.ingest, clock=clock, state_file=config.state_path(state_dir),
                                 backlog_horizon=backlog_horizon)

    async def run(self) -> None:
        await self.reader.run()

    def filter_snapshot(self, snap: Snapshot) -> Snapshot:
        return self.ingest.filter_snapshot(snap)

    def after_snapshot(self, snap: Snapshot) -> None:
        self.ingest.after_snapshot(snap)

