"""The notification log (Alertmanager's nflog): what each receiver was last told about each group, and until when.

Kept in memory for the dispatcher's dedup and written through to the ``nflog`` table; entries expire after two
repeat intervals (set by the delivery worker).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuwatchd.notify.store.records import build_all, number, string_set, text
from gpuwatchd.notify.store.writer import DbWriter, Statement, Write

_UPSERT = (
    "INSERT INTO nflog (receiver, group_key, firing, resolved, timestamp, expires) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (receiver, group_key) DO UPDATE SET firing = excluded.firing,"
    " resolved = excluded.resolved, timestamp = excluded.timestamp, expires = excluded.expires"
)
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """What a receiver was last told about a group (Alertmanager's nflog entry)."""

    firing: frozenset[str]
    resolved: frozenset[str]
    timestamp: float


def _entry(r: dict[str, Any]) -> tuple[Key, tuple[LogEntry, float]]:
    key = (text(r, "receiver"), text(r, "group_key"))
    return key, (
        LogEntry(string_set(r, "firing"), string_set(r, "resolved"), number(r, "timestamp")),
        number(r, "expires"),
    )


class NotificationLog:
    """In-memory log entries by (receiver, group key), written through by ``writer``."""

    def __init__(self, writer: DbWriter, rows: Iterable[dict[str, Any]], skipped: collections.Counter[str]) -> None:
        self._writer = writer
        self._skipped = skipped
        self._log: dict[Key, tuple[LogEntry, float]] = dict(
            build_all(rows, _entry, table="nflog", skipped=skipped, where=writer.path)
        )

    def statement(
        self,
        receiver: str,
        group_key: str,
        firing: Iterable[str],
        resolved: Iterable[str],
        *,
        now: float,
        expires: float,
    ) -> Statement:
        """Record an entry in memory; returns the SQL that stores it (to join another write's transaction)."""
        fs, rs = frozenset(firing), frozenset(resolved)
        self._log[(receiver, group_key)] = (LogEntry(fs, rs, now), expires)
        return _UPSERT, (receiver, group_key, json.dumps(sorted(fs)), json.dumps(sorted(rs)), now, expires)

    def write(
        self,
        receiver: str,
        group_key: str,
        *,
        firing: Iterable[str],
        resolved: Iterable[str],
        now: float,
        expires: float,
    ) -> None:
        """Log a notification that needs no delivery (resolved-only with ``send_resolved: false``)."""
        stmt = self.statement(receiver, group_key, firing, resolved, now=now, expires=expires)
        self._writer.submit(Write((stmt,), "log", f"logging {group_key}"))

    def merge(self, rows: Iterable[dict[str, Any]]) -> None:
        """Add stored entries that memory does not have (a file opened after start); memory's are newer."""
        for key, entry in build_all(rows, _entry, table="nflog", skipped=self._skipped, where=self._writer.path):
            self._log.setdefault(key, entry)

    def get(self, receiver: str, group_key: str) -> LogEntry | None:
        e = self._log.get((receiver, group_key))
        return e[0] if e else None

    def entries(self) -> dict[Key, LogEntry]:
        return {k: e for k, (e, _) in self._log.items()}

    def expire(self, now: float) -> Statement:
        """Forget entries expired at ``now``; returns the SQL that removes them from the table."""
        for k in [k for k, (_, expires) in self._log.items() if expires < now]:
            del self._log[k]
        return "DELETE FROM nflog WHERE expires < ?", (now,)
