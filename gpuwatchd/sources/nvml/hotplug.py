"""Sysfs watch beside the NVML worker: NVIDIA PCI functions appearing or vanishing, and the PCIe link of each GPU.

A live NVML session does not see hot-plug, so a change in the set of NVIDIA PCI functions (Thunderbolt detach,
hot-add) asks for a fresh worker. Links are read from sysfs, not NVML, so they are known while NVML hangs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from gpuwatchd.model import LinkSample
from gpuwatchd.runtime.beat import Beat, next_turn
from gpuwatchd.sources.sysfs.pcie import PciScanCache, SysfsUnreadable, nvidia_devices, read_links

log = logging.getLogger(__name__)

# Floor of the scan period (real seconds): with ``sim --speed 60`` the poll interval is ~17 ms, and a directory
# scan at that rate would cost the event loop more than hot-plug detection is worth.
MIN_PERIOD_SECONDS = 0.1


class SysfsWatch:
    """Scans ``<root>/bus/pci/devices`` every ``period()`` real seconds (at least :data:`MIN_PERIOD_SECONDS`).

    With a ``beat`` (the supervisor's, fired after each worker line) a scan runs on the beat, in the line's wake-up,
    and on its own ``period()`` x 1.1 after the last one when no line comes (``runtime/beat.next_turn``).
    """

    def __init__(
        self,
        root: Callable[[], Path],
        period: Callable[[], float],
        on_change: Callable[[str], None],
        on_links: Callable[[list[LinkSample]], object] | None = None,
        beat: Beat | None = None,
    ) -> None:
        self._root = root
        self._period = period
        self._on_change = on_change
        self._on_links = on_links
        self._beat = beat
        self.seen: set[str] = set()
        self.bus_ids: list[str] = []  # the GPUs of the last snapshot, by PCI bus id: whose links to read
        self.unreadable = 0  # scans skipped because sysfs could not be read (EMFILE, EIO): state unknown
        self._unreadable_logged = False
        self._scan_cache = PciScanCache()  # functions known not to be NVIDIA GPUs: one directory listing a scan

    def baseline(self) -> None:
        """What a worker about to start will enumerate: changes are counted from here."""
        try:
            self.seen = nvidia_devices(self._root(), self._scan_cache)
        except SysfsUnreadable as e:
            self._unreadable(e)  # keep the last set: unknown is not "none"

    def _unreadable(self, e: SysfsUnreadable) -> None:
        self.unreadable += 1
        if not self._unreadable_logged:
            self._unreadable_logged = True
            log.warning("sysfs watch: %s; the PCI device set and links are unknown until it can be read again (not"
                        " taken as removed)", e.strerror)

    async def run(self) -> None:
        """Until cancelled."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await next_turn(self._beat, self._period(), MIN_PERIOD_SECONDS, last)
            last = loop.time()
            root = self._root()
            try:
                current = nvidia_devices(root, self._scan_cache)
                links = read_links(root, self.bus_ids) if self._on_links is not None and self.bus_ids else None
            except SysfsUnreadable as e:
                self._unreadable(e)
                continue
            if self._unreadable_logged:
                self._unreadable_logged = False
                log.info("sysfs watch: sysfs readable again")
            if current != self.seen:
                added = sorted(current - self.seen)
                removed = sorted(self.seen - current)
                self.seen = current
                self._on_change(f"pci_devices_changed: added={added} removed={removed}")
            if self._on_links is not None and links is not None:
                self._on_links(links)
