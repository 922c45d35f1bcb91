"""Durable outbox, notification log and silences in SQLite (``<state_dir>/gpuwatchd.db``).

Protocol: a notification is written to the outbox (status ``pending``) before any HTTP attempt; after a 2xx the row
is marked ``delivered`` and the notification log updated in one transaction. So a kill at any moment leaves either
a pending row (re-sent after restart: at-least-once; the ``Idempotency-Key`` header lets a receiver drop the one
duplicate a kill between "server answered" and "we committed" can cause) or a delivered row (never re-sent).

Durability: WAL with ``synchronous=FULL``. In WAL mode NORMAL already survives a killed *process* (committed
pages are in the OS cache); FULL also survives a host crash or power cut, which is the failure a GPU falling off
the bus can cause.

Threading: every commit fsyncs, and on a slow or busy disk an fsync can take seconds; on the event loop that would
stall ``/metrics`` and the systemd watchdog. So the one SQLite connection belongs to one writer thread, fed in
order through a queue. The loop answers its hot-path questions (next pending row, queue depths, dedup entries)
from an in-memory mirror of the pending rows and the notification log, updated at once by every write; the SQL
follows in the same order on the thread. A delivery worker waits for the queued writes (:meth:`Outbox.drain`) before
each attempt, which keeps "stored before the first HTTP attempt" and "an acknowledged row is committed delivered
before the next request goes out".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import sqlite3
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from gpuwatchd.notify.nflog import LogEntry

log = logging.getLogger(__name__)
T = TypeVar("T")

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


_Job = tuple[Callable[[sqlite3.Connection], Any], "concurrent.futures.Future[Any]"]


def _open(path: Path) -> sqlite3.Connection:
    # check_same_thread stays on: the connection is created and used by the writer thread only.
    db = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT in _tx
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    # Other subsystems may share the file: wait for their write locks rather than fail.
    db.execute("PRAGMA busy_timeout=5000")
    db.executescript(SCHEMA)
    return db


def _serve(path: Path, jobs: queue.SimpleQueue[_Job | None], ready: concurrent.futures.Future[None]) -> None:
    """The writer thread: owns the connection, runs jobs in submission order until ``None``."""
    try:
        db = _open(path)
    except sqlite3.Error as e:
        ready.set_exception(e)
        return
    ready.set_result(None)
    try:
        while (job := jobs.get()) is not None:
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(db))
            except Exception as e:  # handed to whoever awaits the job, and logged by Outbox._check
                fut.set_exception(e)
    finally:
        db.close()


def _tx(*statements: tuple[str, tuple[Any, ...]]) -> Callable[[sqlite3.Connection], int]:
    """One transaction of ``statements``; returns the row count of the last one."""

    def run(db: sqlite3.Connection) -> int:
        db.execute("BEGIN IMMEDIATE")
        try:
            count = 0
            for sql, args in statements:
                count = db.execute(sql, args).rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return count

    return run


_LOG_UPSERT = (
    "INSERT INTO nflog (receiver, group_key, firing, resolved, timestamp, expires) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (receiver, group_key) DO UPDATE SET firing = excluded.firing,"
    " resolved = excluded.resolved, timestamp = excluded.timestamp, expires = excluded.expires"
)


class Outbox:
    """The SQLite store, written by its own thread. Its methods are called from one thread (the event loop)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / DB_NAME
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=_serve, args=(self.path, self._jobs, ready), name="gpuwatchd-outbox", daemon=True
        )
        self._thread.start()
        ready.result()  # a database that cannot be opened fails here, at start-up, as before
        # An Outbox dropped without close() still lets its thread finish the queue and exit.
        self._stop = weakref.finalize(self, self._jobs.put, None)
        self._closed = False
        self._last: concurrent.futures.Future[Any] | None = None
        self._stored: dict[int, concurrent.futures.Future[Any]] = {}
        self.write_errors = 0  # failed writes since start (each one logged)
        # The mirror: pending rows in id order, and the notification log with each entry's expiry.
        self._pending: dict[int, OutboxRow] = {
            r.id: r for r in self._query(lambda db: [_row(x) for x in db.execute(_PENDING_SQL, (PENDING,))])
        }
        self._log: dict[tuple[str, str], tuple[LogEntry, float]] = {
            (r["receiver"], r["group_key"]): (
                LogEntry(_set(r["firing"]), _set(r["resolved"]), r["timestamp"]),
                r["expires"],
            )
            for r in self._query(lambda db: db.execute("SELECT * FROM nflog").fetchall())
        }
        self._next_id = 1 + int(self._query(lambda db: db.execute(_LAST_ID_SQL).fetchone()[0]))

    def close(self) -> None:
        """Finish the queued writes (blocking) and close the database."""
        if not self._closed:
            self._closed = True
            self._stop()
            self._thread.join()

    # -- the writer thread ----------------------------------------------------------------------------------------
    def _submit(self, fn: Callable[[sqlite3.Connection], T], what: str) -> concurrent.futures.Future[T]:
        if self._closed:
            raise RuntimeError(f"outbox closed: cannot {what}")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        fut.add_done_callback(lambda f: self._check(f, what))
        self._last = fut
        return fut

    def _check(self, fut: concurrent.futures.Future[Any], what: str) -> None:
        # Runs on the writer thread. The in-memory state already has the change, so delivery goes on; what is lost
        # is only its survival of a crash. Say so loudly.
        if not fut.cancelled() and fut.exception() is not None:
            self.write_errors += 1
            log.error("notification database %s: %s failed: %s; kept in memory only", self.path, what, fut.exception())

    def _query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the writer thread after every queued write and wait for it (start-up, tests, diagnostics)."""
        if self._closed:
            raise RuntimeError("outbox closed")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut.result()

    def settled(self) -> bool:
        """Whether every write submitted so far is finished (committed, or failed and logged)."""
        return self._last is None or self._last.done()

    async def stored(self, row_id: int) -> bool:
        """Wait until row ``row_id`` is committed; False if writing it failed (already logged)."""
        fut = self._stored.get(row_id)
        if fut is None:
            return True
        # shield: a cancelled waiter (worker stopping) must not cancel the write itself.
        try:
            await asyncio.shield(asyncio.wrap_future(fut))
        except sqlite3.Error:
            return False
        finally:
            if fut.done():
                self._stored.pop(row_id, None)
        return True

    async def drain(self) -> None:
        """Wait until every write submitted so far is committed (or has failed)."""
        if self._last is not None:
            await asyncio.wait([asyncio.wrap_future(self._last)])

    # -- outbox ---------------------------------------------------------------------------------------------------
    def enqueue(
        self, receiver: str, group_key: str, payload: str, *, firing: Iterable[str], resolved: Iterable[str], now: float
    ) -> OutboxRow:
        """Queue a notification for storing and return its row; :meth:`stored` says when it is on disk."""
        row = OutboxRow(
            id=self._next_id,
            receiver=receiver,
            group_key=group_key,
            idempotency_key=uuid.uuid4().hex,
            payload=payload,
            firing=frozenset(firing),
            resolved=frozenset(resolved),
            created=now,
            attempts=0,
            next_attempt=now,
            status=PENDING,
            last_error=None,
        )
        self._next_id += 1
        insert = (
            "INSERT INTO outbox (id, receiver, group_key, idempotency_key, payload, firing, resolved, created,"
            " next_attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                receiver,
                group_key,
                row.idempotency_key,
                payload,
                json.dumps(sorted(row.firing)),
                json.dumps(sorted(row.resolved)),
                now,
                now,
                PENDING,
            ),
        )
        self._stored[row.id] = self._submit(_tx(insert), f"storing notification {row.id}")
        self._pending[row.id] = row
        return row

    def get(self, row_id: int) -> OutboxRow | None:
        if row_id in self._pending:
            return self._pending[row_id]
        r = self._query(lambda db: db.execute("SELECT * FROM outbox WHERE id = ?", (row_id,)).fetchone())
        return _row(r) if r else None

    def next_pending(self, receiver: str) -> OutboxRow | None:
        """The oldest undelivered notification of ``receiver`` (delivery is in order per receiver)."""
        return next((r for r in self._pending.values() if r.receiver == receiver), None)

    def rows(self, receiver: str | None = None) -> list[OutboxRow]:
        """All rows (for tests and diagnostics), oldest first; waits for the queued writes."""
        if receiver is None:
            found = self._query(lambda db: db.execute("SELECT * FROM outbox ORDER BY id").fetchall())
        else:
            sql = "SELECT * FROM outbox WHERE receiver = ? ORDER BY id"
            found = self._query(lambda db: db.execute(sql, (receiver,)).fetchall())
        return [_row(r) for r in found]

    def mark_delivered(self, row: OutboxRow, now: float, log_expires: float, *, log: bool = True) -> None:
        """Delivered + notification log update, in one transaction."""
        self._forget(row.id)
        statements = [
            (
                "UPDATE outbox SET status = ?, attempts = attempts + 1, finished = ?, last_error = NULL WHERE id = ?",
                (DELIVERED, now, row.id),
            )
        ]
        if log:
            statements.append(
                self._log_entry(row.receiver, row.group_key, row.firing, row.resolved, now=now, expires=log_expires)
            )
        self._submit(_tx(*statements), f"marking notification {row.id} delivered")

    def mark_retry(self, row_id: int, next_attempt: float, error: str) -> None:
        r = self._pending.get(row_id)
        if r is not None:
            self._pending[row_id] = replace(r, attempts=r.attempts + 1, next_attempt=next_attempt, last_error=error)
        sql = "UPDATE outbox SET attempts = attempts + 1, next_attempt = ?, last_error = ? WHERE id = ?"
        self._submit(_tx((sql, (next_attempt, error, row_id))), f"scheduling a retry of notification {row_id}")

    def mark_failed(self, row_id: int, now: float, error: str) -> None:
        self._forget(row_id)
        sql = "UPDATE outbox SET status = ?, finished = ?, last_error = ? WHERE id = ?"
        self._submit(_tx((sql, (FAILED, now, error, row_id))), f"marking notification {row_id} failed")

    def supersede(self, receiver: str, before_id: int, now: float) -> int:
        """Drop older pending rows of ``receiver`` that a newer one makes pointless (Alertmanager state pushes)."""
        old = [i for i, r in self._pending.items() if r.receiver == receiver and i < before_id]
        for i in old:
            self._forget(i)
        if old:
            sql = "UPDATE outbox SET status = ?, finished = ? WHERE receiver = ? AND status = ? AND id < ?"
            self._submit(_tx((sql, (SUPERSEDED, now, receiver, PENDING, before_id))), "superseding notifications")
        return len(old)

    def _forget(self, row_id: int) -> None:
        self._pending.pop(row_id, None)
        self._stored.pop(row_id, None)

    def depths(self) -> dict[str, int]:
        """Pending rows per receiver."""
        out: dict[str, int] = {}
        for r in self._pending.values():
            out[r.receiver] = out.get(r.receiver, 0) + 1
        return out

    def gc(self, now: float, keep_seconds: float) -> None:
        """Forget finished rows and expired log entries older than ``keep_seconds``."""
        for k in [k for k, (_, expires) in self._log.items() if expires < now]:
            del self._log[k]
        self._submit(
            _tx(
                ("DELETE FROM outbox WHERE status != ? AND finished < ?", (PENDING, now - keep_seconds)),
                ("DELETE FROM nflog WHERE expires < ?", (now,)),
            ),
            "removing old rows",
        )

    # -- notification log -----------------------------------------------------------------------------------------
    def _log_entry(
        self,
        receiver: str,
        group_key: str,
        firing: Iterable[str],
        resolved: Iterable[str],
        *,
        now: float,
        expires: float,
    ) -> tuple[str, tuple[Any, ...]]:
        fs, rs = frozenset(firing), frozenset(resolved)
        self._log[(receiver, group_key)] = (LogEntry(fs, rs, now), expires)
        return _LOG_UPSERT, (receiver, group_key, json.dumps(sorted(fs)), json.dumps(sorted(rs)), now, expires)

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
        entry = self._log_entry(receiver, group_key, firing, resolved, now=now, expires=expires)
        self._submit(_tx(entry), f"logging {group_key}")

    def effective_entries(self) -> dict[tuple[str, str], LogEntry]:
        """Per (receiver, group): the latest pending notification if any, else the delivered log entry.

        Dedup compares against what was *queued*, so an outage does not queue the same message every interval.
        """
        out = {k: e for k, (e, _) in self._log.items()}
        for r in self._pending.values():
            out[(r.receiver, r.group_key)] = LogEntry(r.firing, r.resolved, r.created)
        return out

    def effective_entry(self, receiver: str, group_key: str) -> LogEntry | None:
        """As :meth:`effective_entries` for one key."""
        found = [r for r in self._pending.values() if r.receiver == receiver and r.group_key == group_key]
        if found:
            r = found[-1]
            return LogEntry(r.firing, r.resolved, r.created)
        e = self._log.get((receiver, group_key))
        return e[0] if e else None

    # -- silences -------------------------------------------------------------------------------------------------
    def save_silence(
        self, sid: str, matchers: str, *, starts_at: float, ends_at: float, created_by: str, comment: str, now: float
    ) -> None:
        sql = (
            "INSERT INTO silences (id, matchers, starts_at, ends_at, created_by, comment, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET matchers = excluded.matchers,"
            " starts_at = excluded.starts_at, ends_at = excluded.ends_at, created_by = excluded.created_by,"
            " comment = excluded.comment, updated_at = excluded.updated_at"
        )
        self._submit(_tx((sql, (sid, matchers, starts_at, ends_at, created_by, comment, now))), f"saving silence {sid}")

    def load_silences(self) -> list[sqlite3.Row]:
        return self._query(lambda db: list(db.execute("SELECT * FROM silences ORDER BY starts_at, id").fetchall()))

    def delete_silences_before(self, ends_before: float) -> None:
        self._submit(_tx(("DELETE FROM silences WHERE ends_at < ?", (ends_before,))), "removing old silences")


_PENDING_SQL = "SELECT * FROM outbox WHERE status = ? ORDER BY id"
# Ids are assigned here, not by SQLite, so enqueue can return at once; never reuse one (AUTOINCREMENT's rule).
_LAST_ID_SQL = (
    "SELECT MAX(COALESCE((SELECT MAX(id) FROM outbox), 0),"
    " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0))"
)
