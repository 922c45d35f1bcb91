"""One Xid counted once when both NVML events and the kernel log report it.

The driver logs an Xid to the kernel log and posts the NVML event at the same moment; the daemon sees the kernel
line at once and the NVML event at the next poll, stamped with that poll's time. So two reports of the same GPU
and code less than ``window`` apart are one Xid. Pairing is one to one: a storm of nine Xid 94s reported by both
paths counts nine, not one and not eighteen.

The window (``kernel_log.dedup_window``, default 10 s): an NVML event is stamped up to one poll interval (1 s by
default) after it happened, later still when the poll is slow (``nvml.poll_timeout``, 5 s by default, before the
worker is replaced); 10 s covers both with slack, while two genuine Xids of the same code on the same GPU within
10 s of each other are still both counted whenever each path reports both (pairing is one to one).
"""

from __future__ import annotations

from collections import deque

from gpuwatchd.model import XidEvent

MAX_PENDING = 4096  # unpaired reports kept for pairing; an Xid storm beyond this is counted, never paired


class XidDeduplicator:
    """Remembers recent unpaired reports of each path and pairs new reports against the other path's."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._pending: dict[str, deque[XidEvent]] = {
            "nvml": deque(maxlen=MAX_PENDING), "kmsg": deque(maxlen=MAX_PENDING),
        }
        self.duplicates = 0

    def admit(self, ev: XidEvent, uuid: str | None) -> bool:
        """True when ``ev`` is a new Xid (count it); False when it pairs with the other path's earlier report."""
        other = self._pending["kmsg" if ev.source == "nvml" else "nvml"]
        horizon = ev.timestamp - self.window
        while other and other[0].timestamp < horizon - self.window:
            other.popleft()  # too old to pair with anything still to come
        for i, prev in enumerate(other):
            if prev.xid == ev.xid and prev.uuid == uuid and abs(prev.timestamp - ev.timestamp) <= self.window:
                del other[i]
                self.duplicates += 1
                return False
        mine = self._pending[ev.source]
        mine.append(ev if ev.uuid == uuid else XidEvent(uuid, ev.xid, ev.timestamp, ev.source, ev.pci_bus_id,
                                                          ev.message))
        return True
