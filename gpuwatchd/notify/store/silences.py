"""Stored silences: the ``silences`` table. ``notify/silences.py`` holds the model and validates each row it loads."""

from __future__ import annotations

import collections
from typing import Any

from gpuwatchd.notify.store.writer import DbWriter, Write

TABLE = "silences"
_UPSERT = (
    "INSERT INTO silences (id, matchers, starts_at, ends_at, created_by, comment, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET matchers = excluded.matchers,"
    " starts_at = excluded.starts_at, ends_at = excluded.ends_at, created_by = excluded.created_by,"
    " comment = excluded.comment, updated_at = excluded.updated_at"
)


class SilenceStore:
    """Rows read at start (handed out once by :meth:`rows`) and writes through ``writer``."""

    def __init__(self, writer: DbWriter, rows: list[dict[str, Any]], skipped: collections.Counter[str]) -> None:
        self._writer = writer
        self._rows = rows
        self._skipped = skipped

    def rows(self) -> list[dict[str, Any]]:
        """The stored rows as read at start (plain dicts, not validated: the model does that)."""
        rows, self._rows = self._rows, []
        return rows

    def count_skipped(self) -> None:
        """A row the model refused (``gpuwatchd_state_db_rows_skipped_total{table="silences"}``)."""
        self._skipped[TABLE] += 1

    def save(
        self, sid: str, matchers: str, *, starts_at: float, ends_at: float, created_by: str, comment: str, now: float
    ) -> None:
        args = (sid, matchers, starts_at, ends_at, created_by, comment, now)
        self._writer.submit(Write(((_UPSERT, args),), "silence", f"saving silence {sid}", key=("silence", sid)))

    def delete_ended_before(self, ends_before: float) -> None:
        stmt = ("DELETE FROM silences WHERE ends_at < ?", (ends_before,))
        self._writer.submit(Write((stmt,), "gc", "removing old silences"))
