"""The daemon's data path: what the NVML supervisor hands over (a snapshot, a late poll, a missed deadline) goes to
the store, with the kernel log's Xid de-duplication, process owners and the rule history on the way, and wakes the
rules."""

from __future__ import annotations

import logging

from gpuwatchd.daemon.parts import DaemonParts
from gpuwatchd.model import NvmlStale, Snapshot, SourceStatus

log = logging.getLogger("gpuwatchd.daemon")


class DataPath(DaemonParts):
    def _on_snapshot(self, snap: Snapshot) -> None:
        if self.kernel_log is not None:
            snap = self.kernel_log.filter_snapshot(snap)  # an Xid the kernel log already counted is not recounted
        self.store.apply(snap)
        self._attribute()
        if self.history is not None:
            self.history.on_snapshot(snap)
        if self.kernel_log is not None:
            self.kernel_log.after_snapshot(snap)
        # node_exporter style self-metrics: a driver outage is a failed collection, not an empty one.
        self.store.ingest(
            SourceStatus(
                name="nvml",
                success=snap.nvml_ok,
                duration_seconds=snap.poll_duration_seconds or 0.0,
                timestamp=snap.timestamp,
                error=snap.nvml_error,
            )
        )
        self._outage.observe(snap, self.config.nvml)
        if self._wakeup is not None:
            self._wakeup.set()

    def _attribute(self) -> None:
        """Owners of the latest snapshot's processes into the store (after a snapshot and a kubelet refresh)."""
        snap = self.store.latest
        if self.attribution is not None and snap is not None:
            self.store.ingest(self.attribution.resolve(snap))

    def _on_late(self, silent_seconds: float) -> None:
        # A poll is late: the values shown are being held, and /metrics says so (gpuwatchd_nvml_stale 1) at once.
        self.store.ingest(NvmlStale())

    def _on_stale(self, reason: str) -> None:
        self.store.ingest(NvmlStale())
        prev = self.store.sources.get("nvml")
        self.store.ingest(
            SourceStatus(
                name="nvml",
                success=False,
                duration_seconds=prev.duration_seconds if prev else 0.0,
                timestamp=self.clock.now(),
                error=reason,
            )
        )
        # DEBUG: the supervisor logs each hang or failure episode once, not once per kill cycle.
        log.debug("NVML worker missed its deadline (%s); serving the last values marked stale", reason)
        if self._wakeup is not None:
            self._wakeup.set()
