"""The state database (``<state_dir>/gpuwatchd.db``, SQLite): one writer thread, and one module per kind of record.

- ``database.py``: schema, connection settings, the start-up check that moves a damaged file aside.
- ``writer.py``: the thread owning the connection (every fsync off the event loop), holding and retrying writes
  the disk refuses.
- ``outbox.py``: notifications before and after delivery; ``nflog.py``: Alertmanager's notification log;
  ``silences.py``: stored silences; ``records.py``: building records from rows, skipping bad ones.
- ``metrics.py``: the ``gpuwatchd_state_db_*`` self-metrics.
"""

from __future__ import annotations

import collections
from pathlib import Path

from prometheus_client.registry import Collector

from gpuwatchd.notify.store.database import DB_NAME
from gpuwatchd.notify.store.metrics import StateDbCollector
from gpuwatchd.notify.store.nflog import NotificationLog
from gpuwatchd.notify.store.outbox import Outbox, OutboxRow
from gpuwatchd.notify.store.silences import SilenceStore
from gpuwatchd.notify.store.writer import DbWriter

__all__ = ["DB_NAME", "NotificationLog", "Outbox", "OutboxRow", "SilenceStore", "StateStore"]


class StateStore:
    """The open database and its stores; ``close()`` finishes the queued writes."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / DB_NAME
        self.writer = DbWriter(self.path)
        loaded = self.writer.loaded
        self.recovered = loaded.recovered
        self.moved_to = loaded.moved_to
        self.skipped: collections.Counter[str] = collections.Counter()
        self.nflog = NotificationLog(self.writer, loaded.nflog, self.skipped)
        self.outbox = Outbox(self.writer, self.nflog, loaded.pending, loaded.last_id, self.skipped,
                             counts=loaded.counts, latest=loaded.latest)  # fmt: skip
        self.silences = SilenceStore(self.writer, loaded.silences, self.skipped)

    def close(self) -> None:
        self.writer.close()

    def collector(self) -> Collector:
        return StateDbCollector(self.writer.stats, self.recovered, self.skipped)
