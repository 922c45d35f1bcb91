"""The daemon's intake of the NVML worker's snapshot lines: the daemon's clock, and names for GPUs lost unnamed.

Runs on the event loop for every poll (``bench/loop.py`` measures it with the store's apply).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwatchd.model import LostGpu, Snapshot, SnapshotDecoder
from gpuwatchd.runtime.clock import Clock


class SnapshotIntake:
    """Turns decoded lines into snapshots; remembers each index's GPU across workers."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.known: dict[int, tuple[str, str | None]] = {}  # index -> (uuid, bus id) from the last snapshots
        # Remembers the last poll's processes: unchanged ones are not decoded again (model.SnapshotDecoder).
        self.decoder = SnapshotDecoder()

    def receive(self, msg: dict[str, Any]) -> Snapshot:
        """One decoded snapshot line (``msg`` is consumed), stamped with the daemon's clock."""
        msg.pop("calls", None)
        msg["timestamp"] = self.clock.now()
        # Xid events drained by this poll are stamped on the daemon's clock too: the worker's wall time is not the
        # rules' time under `sim --speed` (the Xid rule would count them stale), and they are at most a poll old.
        for ev in msg.get("xid_events") or ():
            ev["timestamp"] = msg["timestamp"]
        snap = self.decoder.decode(msg)
        if snap.lost and any(lost.uuid is None for lost in snap.lost):
            snap = replace(snap, lost=tuple(self._identify(lost) for lost in snap.lost))
        if snap.nvml_ok:
            # Merge, not replace: a GPU lost at enumeration keeps the identity its index had before.
            for g in snap.gpus:
                if g.parent_uuid is None:  # a MIG device shares its GPU's index
                    self.known[g.index] = (g.uuid, g.pci_bus_id)
        return snap

    def _identify(self, lost: LostGpu) -> LostGpu:
        """A GPU lost at enumeration answers nothing, not even its UUID: name it from what the last worker saw."""
        if lost.uuid is not None:
            return lost
        known = self.known.get(lost.index)
        if known is None or (lost.pci_bus_id is not None and known[1] != lost.pci_bus_id):
            return lost
        return replace(lost, uuid=known[0], pci_bus_id=known[1])
