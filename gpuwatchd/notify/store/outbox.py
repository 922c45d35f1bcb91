"""The outbox: notifications stored before their first HTTP attempt, and their fate (delivered, failed, superseded).

Protocol: a notification is written (status ``pending``) before any attempt; after a 2xx the row is marked
``delivered`` and the notification log updated in one transaction. So a kill at any moment leaves either a pending
row (re-sent after restart: at-least-once; the ``Idempotency-Key`` header lets a receiver drop the one duplicate a
kill between "server answered" and "we committed" can cause) or a delivered row (never re-sent).

The loop answers its hot-path questions (next pending row, queue depths, dedup entries) from the in-memory pending
rows, updated at once by every write; the SQL follows in the same order on the writer thread. A delivery worker
waits for the queued writes (:meth:`Outbox.drain`) before each attempt, which keeps "stored before the first HTTP
attempt" and "an acknowledged row is committed delivered before the next request goes out" whenever the disk
takes writes; when it does not, delivery goes on from memory (``writer.py``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from gpuwatchd.notify.store.database import PENDING
from gpuwatchd.notify.store.nflog import LogEntry, NotificationLog
from gpuwatchd.notify.store.records import build_all, integer, number, string_set, text
from gpuwatchd.notify.store.writer import ENQUEUE, DbWriter, Statement, Write

log = logging.getLogger(__name__)

DELIVERED, FAILED, SUPERSEDED = "delivered", "failed", "superseded"


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


def row_from(r: dict[str, Any]) -> OutboxRow:
    err = r["last_error"]
    return OutboxRow(
        id=integer(r, "id"),
        receiver=text(r, "receiver"),
        group_key=text(r, "group_key"),
        idempotency_key=text(r, "idempotency_key"),
        payload=text(r, "payload"),
        firing=string_set(r, "firing"),
        resolved=string_set(r, "resolved"),
        created=number(r, "created"),
        attempts=integer(r, "attempts"),
        next_attempt=number(r, "next_attempt"),
        status=text(r, "status"),
        last_error=None if err is None else str(err),
    )


class Outbox:
    """Pending notifications in memory, written through by ``writer``. Called from one thread (the event loop)."""

    def __init__(
        self,
        writer: DbWriter,
        nflog: NotificationLog,
        pending: Iterable[dict[str, Any]],
        last_id: int,
        skipped: collections.Counter[str],
    ) -> None:
        self._writer = writer
        self._nflog = nflog
        self._skipped = skipped
        self._stored: dict[int, concurrent.futures.Future[bool]] = {}
        self._pending: dict[int, OutboxRow] = {
            r.id: r for r in build_all(pending, row_from, table="outbox", skipped=skipped, where=writer.path)
        }
        self._next_id = 1 + last_id

    def _submit(self, statements: Iterable[Statement], op: str, what: str, key: Hashable | None = None) -> None:
        self._writer.submit(Write(tuple(statements), op, what, key=key))

    # -- waiting for the disk -------------------------------------------------------------------------------------
    def settled(self) -> bool:
        """Whether every write submitted so far was tried (committed, or held in memory and counted)."""
        return self._writer.settled()

    async def drain(self) -> None:
        """Wait until every write submitted so far was tried."""
        await self._writer.drain()

    async def stored(self, row_id: int) -> bool:
        """Wait until row ``row_id`` was tried; False if it is held in memory only (already logged)."""
        fut = self._stored.get(row_id)
        if fut is None:
            return True
        # shield: a cancelled waiter (worker stopping) must not cancel the write itself.
        try:
            return await asyncio.shield(asyncio.wrap_future(fut))
        finally:
            if fut.done():
                self._stored.pop(row_id, None)

    # -- rows -----------------------------------------------------------------------------------------------------
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
        w = Write((insert,), ENQUEUE, f"storing notification {row.id}")
        self._stored[row.id] = self._writer.submit(w)
        self._pending[row.id] = row
        return row

    def get(self, row_id: int) -> OutboxRow | None:
        if row_id in self._pending:
            return self._pending[row_id]
        found = self._read("SELECT * FROM outbox WHERE id = ?", (row_id,))
        return found[0] if found else None

    def _merge_late(self) -> None:
        """Take in the rows of a file that could only be opened after start (full disk at start, ``writer.py``)."""
        late = self._writer.take_late_loaded()
        if late is None:
            return
        rows = build_all(late.pending, row_from, table="outbox", skipped=self._skipped, where=self._writer.path)
        queued = {(r.receiver, r.group_key) for r in self._pending.values()}
        # A group queued again since start has a newer message with the current state: the old one is stale.
        stale = [r.id for r in rows if (r.receiver, r.group_key) in queued]
        old = {r.id: r for r in rows if r.id not in self._pending and r.id not in stale}
        # Their ids are below every id given out since start: in id order they go first, as they were queued first.
        self._pending = dict(sorted({**self._pending, **old}.items()))
        if stale:
            marks = "UPDATE outbox SET status = ?, finished = ? WHERE id = ?"
            now = time.time()
            self._submit([(marks, (SUPERSEDED, now, i)) for i in stale], "supersede", "superseding stale notifications")
        self._nflog.merge(late.nflog)
        log.warning(
            "notification database %s: opened late; %d notifications queued before the start resumed, %d replaced by"
            " newer ones (stored silences are used from the next start)",
            self._writer.path,
            len(old),
            len(stale),
        )

    def next_pending(self, receiver: str) -> OutboxRow | None:
        """The oldest undelivered notification of ``receiver`` (delivery is in order per receiver)."""
        self._merge_late()
        return next((r for r in self._pending.values() if r.receiver == receiver), None)

    def rows(self, receiver: str | None = None) -> list[OutboxRow]:
        """All stored rows (tests and diagnostics), oldest first; waits for the queued writes.

        If the file cannot be read, the pending rows in memory (the ones that matter), logged.
        """
        if receiver is None:
            return self._read("SELECT * FROM outbox ORDER BY id", ())
        return self._read("SELECT * FROM outbox WHERE receiver = ? ORDER BY id", (receiver,), receiver)

    def _read(self, sql: str, args: tuple[Any, ...], receiver: str | None = None) -> list[OutboxRow]:
        try:
            found = self._writer.query(lambda db: [dict(r) for r in db.execute(sql, args).fetchall()])
        except Exception as e:  # sqlite3.DatabaseError, or the writer closed: memory still knows what is pending
            log.warning(
                "notification database %s: cannot read the outbox (%s); using the rows in memory", self._writer.path, e
            )
            return [r for r in self._pending.values() if receiver is None or r.receiver == receiver]
        out = []
        for r in found:
            with contextlib.suppress(Exception):  # unreadable: already logged and counted at start
                out.append(row_from(r))
        return out

    def mark_delivered(self, row: OutboxRow, now: float, log_expires: float, *, log: bool = True) -> None:
        """Delivered + notification log update, in one transaction."""
        self._forget(row.id)
        statements: list[Statement] = [
            (
                "UPDATE outbox SET status = ?, attempts = ?, finished = ?, last_error = NULL WHERE id = ?",
                (DELIVERED, row.attempts + 1, now, row.id),
            )
        ]
        if log:
            statements.append(
                self._nflog.statement(
                    row.receiver, row.group_key, row.firing, row.resolved, now=now, expires=log_expires
                )
            )
        self._submit(statements, "deliver", f"marking notification {row.id} delivered")

    def mark_retry(self, row_id: int, next_attempt: float, error: str) -> None:
        r = self._pending.get(row_id)
        if r is None:
            return
        if not math.isfinite(next_attempt):
            # NOT NULL column: a NaN (SQLite stores it as NULL) failed the write and it was dropped. Retry at once
            # rather than lose the row's state; the caller's backoff is what spaces attempts.
            log.error("notification %d: retry time %r is not a number; retrying now", row_id, next_attempt)
            next_attempt = r.next_attempt
        r = self._pending[row_id] = replace(r, attempts=r.attempts + 1, next_attempt=next_attempt, last_error=error)
        # Absolute values, so a held retry mark can be replaced by the next one (writer.py).
        sql = "UPDATE outbox SET attempts = ?, next_attempt = ?, last_error = ? WHERE id = ?"
        self._submit(
            [(sql, (r.attempts, next_attempt, error, row_id))],
            "retry",
            f"scheduling a retry of notification {row_id}",
            key=("retry", row_id),
        )

    def mark_failed(self, row_id: int, now: float, error: str) -> None:
        self._forget(row_id)
        sql = "UPDATE outbox SET status = ?, finished = ?, last_error = ? WHERE id = ?"
        self._submit([(sql, (FAILED, now, error, row_id))], "fail", f"marking notification {row_id} failed")

    def supersede(self, receiver: str, before_id: int, now: float) -> int:
        """Drop older pending rows of ``receiver`` that a newer one makes pointless (Alertmanager state pushes)."""
        old = [i for i, r in self._pending.items() if r.receiver == receiver and i < before_id]
        for i in old:
            self._forget(i)
        if old:
            sql = "UPDATE outbox SET status = ?, finished = ? WHERE receiver = ? AND status = ? AND id < ?"
            self._submit(
                [(sql, (SUPERSEDED, now, receiver, PENDING, before_id))], "supersede", "superseding notifications"
            )
        return len(old)

    def _forget(self, row_id: int) -> None:
        self._pending.pop(row_id, None)
        self._stored.pop(row_id, None)

    def depths(self) -> dict[str, int]:
        """Pending rows per receiver."""
        self._merge_late()
        out: dict[str, int] = {}
        for r in self._pending.values():
            out[r.receiver] = out.get(r.receiver, 0) + 1
        return out

    def gc(self, now: float, keep_seconds: float) -> None:
        """Forget finished rows older than ``keep_seconds`` and expired log entries."""
        self._submit(
            [
                ("DELETE FROM outbox WHERE status != ? AND finished < ?", (PENDING, now - keep_seconds)),
                self._nflog.expire(now),
            ],
            "gc",
            "removing old rows",
        )

    # -- what each receiver was told, or is about to be --------------------------------------------------------------
    def effective_entries(self) -> dict[tuple[str, str], LogEntry]:
        """Per (receiver, group): the latest pending notification if any, else the delivered log entry.

        Dedup compares against what was *queued*, so an outage does not queue the same message every interval.
        """
        out = self._nflog.entries()
        for r in self._pending.values():
            out[(r.receiver, r.group_key)] = LogEntry(r.firing, r.resolved, r.created)
        return out

    def effective_entry(self, receiver: str, group_key: str) -> LogEntry | None:
        """As :meth:`effective_entries` for one key."""
        found = [r for r in self._pending.values() if r.receiver == receiver and r.group_key == group_key]
        if found:
            r = found[-1]
            return LogEntry(r.firing, r.resolved, r.created)
        return self._nflog.get(receiver, group_key)
