"""Durable outbox, notification log and silences in SQLite (``<state_dir>/gpuwatchd.db``).

Protocol: a notification is written to the outbox (status ``pending``) before any HTTP attempt; after a 2xx the row
is marked ``delivered`` and the notification log updated in one transaction. So a kill at any moment leaves either
a pending row (re-sent after restart: at-least-once; the ``Idempotency-Key`` header lets a receiver drop the one
duplicate a kill between "server answered" and "we committed" can cause) or a delivered row (never re-sent).

Durability: WAL with ``synchronous=FULL``. In WAL mode NORMAL already survives a killed *process* (committed
pages are in the OS cache); FULL also survives a host crash or power cut, which is the failure a GPU falling off
the bus can cause. Writes are one small transaction per notification, so the fsync cost is negligible, and the
calls are made inline on the event loop for that reason.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuwatchd.notify.grouping import LogEntry

DB_NAME = "gpuwatchd.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    group_key TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    payload TEXT NOT NULL,
    firing TEXT NOT NULL,
    resolved TEXT NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL,
    status TEXT NOT NULL,
    last_error TEXT,
    finished REAL
);
CREATE INDEX IF NOT EXISTS outbox_queue ON outbox (receiver, status, id);
CREATE TABLE IF NOT EXISTS nflog (
    receiver TEXT NOT NULL,
    group_key TEXT NOT NULL,
    firing TEXT NOT NULL,
    resolved TEXT NOT NULL,
    timestamp REAL NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (receiver, group_key)
);
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    matchers TEXT NOT NULL,
    starts_at REAL NOT NULL,
    ends_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""
PENDING, DELIVERED, FAILED, SUPERSEDED = "pending", "delivered", "failed", "superseded"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One notification waiting for (or done with) delivery."""

    id: int
    receiver: str
    group_key: str
    idempotency_key: str
    payload: str
    firing: frozenset[str]
    resolved: frozenset[str]
    created: float
    attempts: int
    next_attempt: float
    status: str
    last_error: str | None


def _set(text: str) -> frozenset[str]:
    return frozenset(json.loads(text))


def _row(r: sqlite3.Row) -> OutboxRow:
    return OutboxRow(
        id=r["id"],
        receiver=r["receiver"],
        group_key=r["group_key"],
        idempotency_key=r["idempotency_key"],
        payload=r["payload"],
        firing=_set(r["firing"]),
        resolved=_set(r["resolved"]),
        created=r["created"],
        attempts=r["attempts"],
        next_attempt=r["next_attempt"],
        status=r["status"],
        last_error=r["last_error"],
    )


class Outbox:
    """The SQLite store. Not thread-safe: used from the event loop only."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / DB_NAME
        self._db = sqlite3.connect(self.path, isolation_level=None)  # explicit transactions below
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        # Other subsystems may share the file: wait for their write locks rather than fail.
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- outbox ---------------------------------------------------------------------------------------------------
    def enqueue(
        self, receiver: str, group_key: str, payload: str, *, firing: Iterable[str], resolved: Iterable[str], now: float
    ) -> OutboxRow:
        """Persist a notification (committed before this returns)."""
        key = uuid.uuid4().hex
        with self._db:
            cur = self._db.execute(
                "INSERT INTO outbox (receiver, group_key, idempotency_key, payload, firing, resolved, created,"
                " next_attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    receiver,
                    group_key,
                    key,
                    payload,
                    json.dumps(sorted(firing)),
                    json.dumps(sorted(resolved)),
                    now,
                    now,
                    PENDING,
                ),
            )
        row = self.get(int(cur.lastrowid or 0))
        assert row is not None
        return row

    def get(self, row_id: int) -> OutboxRow | None:
        r = self._db.execute("SELECT * FROM outbox WHERE id = ?", (row_id,)).fetchone()
        return _row(r) if r else None

    def next_pending(self, receiver: str) -> OutboxRow | None:
        """The oldest undelivered notification of ``receiver`` (delivery is in order per receiver)."""
        r = self._db.execute(
            "SELECT * FROM outbox WHERE receiver = ? AND status = ? ORDER BY id LIMIT 1", (receiver, PENDING)
        ).fetchone()
        return _row(r) if r else None

    def rows(self, receiver: str | None = None) -> list[OutboxRow]:
        """All rows (for tests and the status API), oldest first."""
        if receiver is None:
            cur = self._db.execute("SELECT * FROM outbox ORDER BY id")
        else:
            cur = self._db.execute("SELECT * FROM outbox WHERE receiver = ? ORDER BY id", (receiver,))
        return [_row(r) for r in cur.fetchall()]

    def mark_delivered(self, row: OutboxRow, now: float, log_expires: float, *, log: bool = True) -> None:
        """Delivered + notification log update, atomically."""
        with self._db:
            self._db.execute(
                "UPDATE outbox SET status = ?, attempts = attempts + 1, finished = ?, last_error = NULL WHERE id = ?",
                (DELIVERED, now, row.id),
            )
            if log:
                self._write_log(
                    row.receiver, row.group_key, firing=row.firing, resolved=row.resolved, now=now, expires=log_expires
                )

    def mark_retry(self, row_id: int, next_attempt: float, error: str) -> None:
        with self._db:
            self._db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, last_error = ? WHERE id = ?",
                (next_attempt, error, row_id),
            )

    def mark_failed(self, row_id: int, now: float, error: str) -> None:
        with self._db:
            self._db.execute(
                "UPDATE outbox SET status = ?, finished = ?, last_error = ? WHERE id = ?", (FAILED, now, error, row_id)
            )

    def supersede(self, receiver: str, before_id: int, now: float) -> int:
        """Drop older pending rows of ``receiver`` that a newer one makes pointless (Alertmanager state pushes)."""
        with self._db:
            cur = self._db.execute(
                "UPDATE outbox SET status = ?, finished = ? WHERE receiver = ? AND status = ? AND id < ?",
                (SUPERSEDED, now, receiver, PENDING, before_id),
            )
        return cur.rowcount

    def depths(self) -> dict[str, int]:
        """Pending rows per receiver."""
        cur = self._db.execute("SELECT receiver, COUNT(*) FROM outbox WHERE status = ? GROUP BY receiver", (PENDING,))
        return {r[0]: int(r[1]) for r in cur.fetchall()}

    def gc(self, now: float, keep_seconds: float) -> None:
        """Forget finished rows and expired log entries older than ``keep_seconds``."""
        with self._db:
            self._db.execute("DELETE FROM outbox WHERE status != ? AND finished < ?", (PENDING, now - keep_seconds))
            self._db.execute("DELETE FROM nflog WHERE expires < ?", (now,))

    # -- notification log -----------------------------------------------------------------------------------------
    def _write_log(
        self,
        receiver: str,
        group_key: str,
        *,
        firing: Iterable[str],
        resolved: Iterable[str],
        now: float,
        expires: float,
    ) -> None:
        self._db.execute(
            "INSERT INTO nflog (receiver, group_key, firing, resolved, timestamp, expires) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (receiver, group_key) DO UPDATE SET firing = excluded.firing,"
            " resolved = excluded.resolved, timestamp = excluded.timestamp, expires = excluded.expires",
            (receiver, group_key, json.dumps(sorted(firing)), json.dumps(sorted(resolved)), now, expires),
        )

    def write_log(
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
        with self._db:
            self._write_log(receiver, group_key, firing=firing, resolved=resolved, now=now, expires=expires)

    def effective_entries(self) -> dict[tuple[str, str], LogEntry]:
        """Per (receiver, group): the latest pending notification if any, else the delivered log entry.

        Dedup compares against what was *queued*, so an outage does not queue the same message every interval.
        """
        out: dict[tuple[str, str], LogEntry] = {}
        for r in self._db.execute("SELECT * FROM nflog").fetchall():
            out[(r["receiver"], r["group_key"])] = LogEntry(_set(r["firing"]), _set(r["resolved"]), r["timestamp"])
        for r in self._db.execute("SELECT * FROM outbox WHERE status = ? ORDER BY id", (PENDING,)).fetchall():
            out[(r["receiver"], r["group_key"])] = LogEntry(_set(r["firing"]), _set(r["resolved"]), r["created"])
        return out

    def effective_entry(self, receiver: str, group_key: str) -> LogEntry | None:
        """As :meth:`effective_entries` for one key."""
        r = self._db.execute(
            "SELECT firing, resolved, created FROM outbox WHERE receiver = ? AND group_key = ? AND status = ?"
            " ORDER BY id DESC LIMIT 1",
            (receiver, group_key, PENDING),
        ).fetchone()
        if r:
            return LogEntry(_set(r[0]), _set(r[1]), r[2])
        r = self._db.execute(
            "SELECT firing, resolved, timestamp FROM nflog WHERE receiver = ? AND group_key = ?", (receiver, group_key)
        ).fetchone()
        return LogEntry(_set(r[0]), _set(r[1]), r[2]) if r else None

    # -- silences -------------------------------------------------------------------------------------------------
    def save_silence(
        self, sid: str, matchers: str, *, starts_at: float, ends_at: float, created_by: str, comment: str, now: float
    ) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO silences (id, matchers, starts_at, ends_at, created_by, comment, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET matchers = excluded.matchers,"
                " starts_at = excluded.starts_at, ends_at = excluded.ends_at, created_by = excluded.created_by,"
                " comment = excluded.comment, updated_at = excluded.updated_at",
                (sid, matchers, starts_at, ends_at, created_by, comment, now),
            )

    def load_silences(self) -> list[sqlite3.Row]:
        return list(self._db.execute("SELECT * FROM silences ORDER BY starts_at, id").fetchall())

    def delete_silences_before(self, ends_before: float) -> None:
        with self._db:
            self._db.execute("DELETE FROM silences WHERE ends_at < ?", (ends_before,))
