"""Sysfs watch beside the NVML worker: NVIDIA PCI functions appearing or vanishing, and the PCIe link of each GPU.

A live NVML session does not see hot-plug, so a change in the set of NVIDIA PCI functions (Thunderbolt detach,
hot-add) asks for a fresh worker. Links are read from sysfs, not NVML, so they are known while NVML hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from gpuwatchd.model import LinkSample
from gpuwatchd.sources.sysfs_pcie import nvidia_devices, read_links

# Floor of the scan period (real seconds): with ``sim --speed 60`` the poll interval is ~17 ms, and a directory
# scan at that rate would cost the event loop more than hot-plug detection is worth.
MIN_PERIOD_SECONDS = 0.1


class SysfsWatch:
    """Scans ``<root>/bus/pci/devices`` every ``period()`` real seconds (at least :data:`MIN_PERIOD_SECONDS`)."""

    def __init__(
        self,
        root: Callable[[], Path],
        period: Callable[[], float],
        on_change: Callable[[str], None],
        on_links: Callable[[list[LinkSample]], None] | None = None,
    ) -> None:
        self._root = root
        self._period = period
        self._on_change = on_change
        self._on_links = on_links
        self.seen: set[str] = set()
        self.bus_ids: list[str] = []  # the GPUs of the last snapshot, by PCI bus id: whose links to read

    def baseline(self) -> None:
        """What a worker about to start will enumerate: changes are counted from here."""
        self.seen = nvidia_devices(self._root())

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            await asyncio.sleep(max(self._period(), MIN_PERIOD_SECONDS))
            root = self._root()
            current = nvidia_devices(root)
            if current != self.seen:
                added = sorted(current - self.seen)
                removed = sorted(self.seen - current)
                self.seen = current
                self._on_change(f"pci_devices_changed: added={added} removed={removed}")
            if self._on_links is not None and self.bus_ids:
                self._on_links(read_links(root, self.bus_ids))
