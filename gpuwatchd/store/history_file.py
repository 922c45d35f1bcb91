"""The daemon's side of rule-history persistence (format and checks in ``gpuwatchd.store.persist``): load once at
start, prune at the first snapshot, save every ``SAVE_INTERVAL`` and at stop, with its self-metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.model import Snapshot
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.state_files import StateFileError, read_bytes, set_aside
from gpuwatchd.store import Store, persist

MAX_FILE_BYTES = 64 * 1024 * 1024  # compressed; what it decompresses to is bounded by persist.MAX_BYTES

log = logging.getLogger(__name__)

# A minute of history lost at a crash is two leak evaluations: the onset (minutes to hours back) survives.
SAVE_INTERVAL = 60.0


class HistoryFile:
    """``<state_dir>/rule-history.z`` for one daemon run."""

    def __init__(self, state_dir: Path, store: Store, clock: Clock, *, interval: float = SAVE_INTERVAL) -> None:
        self.path = state_dir / persist.FILE_NAME
        self._store = store
        self._clock = clock
        self._interval = interval
        self._pending_prune = False
        self._lock = asyncio.Lock()
        self.load_errors = 0
        self.save_errors = 0
        self.restored = 0
        self.saved_bytes = 0

    def load(self) -> None:
        """Restore the saved history into the store; a missing file is a first start, a bad one starts empty."""
        try:
            data = read_bytes(self.path, MAX_FILE_BYTES)
        except StateFileError as e:
            self._load_failed(str(e))
            return
        if data is None:
            return
        try:
            hist = persist.decode(data)
        except persist.HistoryError as e:
            self._load_failed(str(e))
            return
        self.restored = persist.restore(self._store, hist, self._clock.now())
        self._pending_prune = True
        log.info("rule history: %d series restored from %s", self.restored, self.path)

    def _load_failed(self, why: str) -> None:
        self.load_errors += 1
        counts = self._store.state_files_set_aside
        counts["rule_history"] = counts.get("rule_history", 0) + 1
        aside = set_aside(self.path)
        log.warning("rule history %s unusable: %s; starting with empty history%s", self.path, why,
                    f"; the file is kept as {aside}" if aside is not None else "")

    def on_snapshot(self, snap: Snapshot) -> None:
        """At the first snapshot after a restore: drop GPUs and processes that are gone (a reused pid starts
        afresh)."""
        if self._pending_prune and snap.nvml_ok:
            self._pending_prune = False
            dropped = persist.prune(self._store, snap)
            if dropped:
                log.info("rule history: %d restored series no longer exist, dropped", dropped)

    async def save(self) -> None:
        """Copy the rings on the loop, encode and write them atomically in a thread."""
        async with self._lock:
            rings = persist.copy_rings(self._store)
            now = self._clock.now()

            def write() -> int:
                data = persist.encode_rings(rings, now)
                persist.write_atomic(self.path, data)
                return len(data)

            try:
                self.saved_bytes = await asyncio.to_thread(write)
            except OSError as e:
                self.save_errors += 1
                log.warning("rule history: cannot write %s (%s); kept in memory, retried in %.0fs",
                            self.path, e.strerror or e, self._interval)

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self._interval)
            await self.save()

    def collector(self) -> Collector:
        return _HistoryCollector(self)


class _HistoryCollector(Collector):
    def __init__(self, owner: HistoryFile) -> None:
        self._h = owner

    def collect(self) -> Iterator[Metric]:
        h = self._h
        yield CounterMetricFamily(
            "gpuwatchd_rule_history_load_errors",
            "Rule history files found corrupt, truncated or hostile at start (the daemon started with empty history).",
            value=float(h.load_errors),
        )
        yield CounterMetricFamily(
            "gpuwatchd_rule_history_save_errors",
            "Rule history saves that failed (disk full, I/O error); the history stays in memory and is saved again.",
            value=float(h.save_errors),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_rule_history_restored_series",
            "History series (GPUs and processes) restored from the state directory at start.",
            value=float(h.restored),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_rule_history_file_bytes", "Size of the last rule history file written.",
            value=float(h.saved_bytes),
        )
