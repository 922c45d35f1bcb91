"""Self-metrics of the state database (docs/metrics.md, "State database"). Read from memory on scrape, no I/O."""

from __future__ import annotations

import collections
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.notify.store.writer import WriterStats

RECOVERY_REASONS = ("corrupt", "schema")
TABLES = ("outbox", "nflog", "silences")
WRITE_OPS = ("enqueue", "deliver", "retry", "fail", "supersede", "log", "silence", "gc")


class StateDbCollector(Collector):
    def __init__(self, stats: WriterStats, recovered: str | None, skipped: collections.Counter[str]) -> None:
        self._stats = stats
        self._recovered = recovered
        self._skipped = skipped

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        rec = CounterMetricFamily(
            "gpuwatchd_state_db_recovered",
            "Times a damaged state database was moved aside at start (gpuwatchd.db.corrupt-<time>), by reason.",
            labels=["reason"],
        )
        for reason in RECOVERY_REASONS:
            rec.add_metric([reason], 1.0 if self._recovered == reason else 0.0)
        yield rec
        skipped = CounterMetricFamily(
            "gpuwatchd_state_db_rows_skipped",
            "Stored rows that could not be read at start and were skipped.",
            labels=["table"],
        )
        for table in TABLES:
            skipped.add_metric([table], float(self._skipped[table]))
        yield skipped
        fails = CounterMetricFamily(
            "gpuwatchd_state_db_write_failures",
            "Writes not committed when made (disk full, I/O error), by operation; held in memory and retried.",
            labels=["op"],
        )
        for op in sorted(set(WRITE_OPS) | set(s.failures)):
            fails.add_metric([op], float(s.failures[op]))
        yield fails
        yield CounterMetricFamily(
            "gpuwatchd_state_db_writes_dropped",
            "Writes given up: held past the memory bound, or refused for good by SQLite.",
            value=float(s.dropped),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_state_db_writes_held", "Writes held in memory until the disk takes them.", value=float(s.held)
        )
        yield GaugeMetricFamily(
            "gpuwatchd_state_db_unpersisted_notifications",
            "Queued notifications held only in memory (lost if the daemon is killed before the disk takes them).",
            value=float(s.held_notifications),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_state_db_writable",
            "1 if the last write to the state database committed.",
            value=1.0 if s.writable else 0.0,
        )
