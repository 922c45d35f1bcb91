"""The outbox: notifications stored before their first HTTP attempt, and their fate (delivered, failed, superseded).

Protocol: a notification is written (status ``pending``) before any attempt; after a 2xx the row is marked
``delivered`` and the notification log updated in one transaction. So a kill at any moment leaves either a pending
row (re-sent after restart: at-least-once; the ``Idempotency-Key`` header lets a receiver drop the one duplicate a
kill between "server answered" and "we committed" can cause) or a delivered row (never re-sent).

The loop answers its hot-path questions (next pending row, queue depths, dedup entries) from memory, updated at
once by every write: a page of each receiver's oldest pending rows (``database.PAGE_ROWS``; the rest is counted, and
paged in by the worker as it drains: :meth:`Outbox.refill`), and the newest pending row of each group (dedup);
the SQL follows in the same order on the writer thread. A delivery worker
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
import sqlite3
import time
import uuid
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from gpuwatchd.notify.store.database import MAX_PAYLOAD_BYTES, PAGE_ROWS, PENDING, page_rows
from gpuwatchd.notify.store.nflog import LogEntry, NotificationLog
from gpuwatchd.notify.store.records import build_all, integer, number, string_set, text
from gpuwatchd.notify.store.writer import ENQUEUE, DbWriter, Statement, Write

log = logging.getLogger(__name__)

DELIVERED, FAILED, SUPERSEDED = "delivered", "failed", "superseded"


class PayloadTooLarge(ValueError):
    """A notification over ``MAX_PAYLOAD_BYTES``: not stored, not sent."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes, over the {MAX_PAYLOAD_BYTES}-byte cap of a notification")
        self.size = size


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


def _entry(r: dict[str, Any]) -> tuple[tuple[str, str], tuple[int, LogEntry]]:
    return (text(r, "receiver"), text(r, "group_key")), (
        integer(r, "id"), LogEntry(string_set(r, "firing"), string_set(r, "resolved"), number(r, "created"))
    )


class Outbox:
    """Pending notifications, a page per receiver in memory, written through by ``writer``. Called from one thread
    (the event loop)."""

    def __init__(
        self,
        writer: DbWriter,
        nflog: NotificationLog,
        pending: Iterable[dict[str, Any]],
        last_id: int,
        skipped: collections.Counter[str],
        *,
        counts: dict[str, int] | None = None,
        latest: Iterable[dict[str, Any]] = (),
    ) -> None:
        self._writer = writer
        self._nflog = nflog
        self._skipped = skipped
        self._stored: dict[int, concurrent.futures.Future[bool]] = {}
        self._pending: dict[int, OutboxRow] = {}
        self._in_memory: collections.Counter[str] = collections.Counter()
        # Per receiver: pending rows on disk only (an estimate the next page read corrects), and the id up to which
        # every pending row was in memory (pages are read above it).
        self._backlog: collections.Counter[str] = collections.Counter()
        self._cursor: dict[str, int] = {}
        self._latest: dict[tuple[str, str], tuple[int, LogEntry]] = {}
        self._next_id = self._first_id = 1 + last_id
        self._take_in(pending, counts, latest)

    def _take_in(
        self, raw: Iterable[dict[str, Any]], counts: dict[str, int] | None, latest: Iterable[dict[str, Any]],
        *, late: bool = False,
    ) -> None:
        """Rows read at start (or at a late open): their first pages, counts and newest rows per group."""
        raw = list(raw)
        fetched: collections.Counter[str] = collections.Counter()
        top: dict[str, int] = {}
        for r in raw:
            with contextlib.suppress(Exception):
                fetched[str(r["receiver"])] += 1
                top[str(r["receiver"])] = max(top.get(str(r["receiver"]), 0), int(r["id"]))
        for row in self._build(raw):
            self._add(row)
        for receiver, n in (counts or {}).items():
            more = max(0, n - fetched[receiver])
            self._backlog[receiver] += more
            if late and more:
                # The file's rows are older than any queued since start: page in from the end of its first page.
                self._cursor[receiver] = top.get(receiver, 0)
        for receiver, i in top.items():
            if not (late and receiver in self._cursor and (counts or {}).get(receiver, 0) > fetched[receiver]):
                self._cursor[receiver] = max(self._cursor.get(receiver, 0), i)
        for key, entry in self._entries(latest):
            if key not in self._latest or self._latest[key][0] < entry[0]:
                self._latest[key] = entry

    def _entries(self, latest: Iterable[dict[str, Any]]) -> list[tuple[tuple[str, str], tuple[int, LogEntry]]]:
        out = []
        for r in latest:
            with contextlib.suppress(Exception):  # a bad row is counted where its page is read
                out.append(_entry(r))
        return out

    def _build(self, raw: list[dict[str, Any]]) -> list[OutboxRow]:
        """Records of rows read from the file; a row whose payload is over the cap is failed, not sent."""
        big = [r for r in raw if r.get("payload") is None and isinstance(r.get("payload_bytes"), int)]
        if big:
            now = time.time()
            sql = "UPDATE outbox SET status = ?, finished = ?, last_error = ? WHERE id = ?"
            marks = []
            for r in big:
                error = f"stored notification of {r['payload_bytes']} bytes is over the {MAX_PAYLOAD_BYTES}-byte cap"
                log.error("notification database %s: notification %s to %s not sent: %s", self._writer.path,
                          r.get("id"), r.get("receiver"), error)  # fmt: skip
                marks.append((sql, (FAILED, now, error, r.get("id"))))
            self._submit(marks, "fail", "failing notifications over the size cap")
            raw = [r for r in raw if r not in big]
        return build_all(raw, row_from, table="outbox", skipped=self._skipped, where=self._writer.path)

    def _add(self, row: OutboxRow) -> None:
        if row.id not in self._pending:
            self._pending[row.id] = row
            self._in_memory[row.receiver] += 1

    # -- paging -----------------------------------------------------------------------------------------------------
    def rows_in_memory(self) -> int:
        """Pending rows held in memory, payloads included (at most ``PAGE_ROWS`` per receiver, plus any a late
        open brought)."""
        return len(self._pending)

    def backlog(self, receiver: str) -> int:
        """Pending rows of ``receiver`` on disk only, not yet paged in (an estimate; 0 means none)."""
        self._merge_late()
        return self._backlog.get(receiver, 0)

    async def refill(self, receiver: str) -> bool:
        """Page in the next rows of ``receiver`` from the file, in id order, up to ``PAGE_ROWS`` in memory; False
        when the file cannot be trusted for it yet (writes held in memory: retry later)."""
        want = PAGE_ROWS - self._in_memory.get(receiver, 0)
        if want <= 0 or self._backlog.get(receiver, 0) <= 0:
            return True
        after = self._cursor.get(receiver, 0)
        # Rows enqueued in memory above the cursor (only after a late open) come back from the query: skip them.
        above = sum(1 for r in self._pending.values() if r.receiver == receiver and r.id > after)
        writer = self._writer

        def read(db: sqlite3.Connection) -> list[dict[str, Any]] | None:
            if writer.holding():  # the file misses writes still held: what it says pending may be done
                return None
            return page_rows(db, receiver, after, want + above)

        try:
            raw = await writer.query_async(read)
        except Exception as e:  # sqlite3.DatabaseError, or the writer closed
            log.warning("notification database %s: cannot read the outbox of %s (%s)", writer.path, receiver, e)
            return False
        if raw is None:
            return False
        if after != self._cursor.get(receiver, 0):
            return True  # another page came in meanwhile: its reader counted
        fresh = [r for r in raw if r["id"] not in self._pending]
        if raw:
            self._cursor[receiver] = max(after, *(int(r["id"]) for r in raw))
        for row in self._build(fresh):
            self._add(row)
        if len(raw) < want + above:
            self._backlog[receiver] = 0  # read to the end
        else:
            self._backlog[receiver] = max(1, self._backlog[receiver] - len(fresh))  # more, or an empty read next
        return True

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
        """Queue a notification for storing and return its row; :meth:`stored` says when it is on disk.

        Raises ``PayloadTooLarge`` for a payload over ``MAX_PAYLOAD_BYTES`` (nothing is stored)."""
        size = len(payload.encode("utf-8", "surrogatepass"))
        if size > MAX_PAYLOAD_BYTES:
            raise PayloadTooLarge(size)
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
        future = self._writer.submit(w)
        self._latest[(receiver, group_key)] = (row.id, LogEntry(row.firing, row.resolved, now))
        if self._backlog.get(receiver, 0) > 0 or self._in_memory.get(receiver, 0) >= PAGE_ROWS:
            # Behind rows still on disk, or a full page: it waits on disk too (a long outage queues without end).
            self._backlog[receiver] += 1
            return row
        self._stored[row.id] = future
        self._add(row)
        self._cursor[receiver] = max(self._cursor.get(receiver, 0), row.id)
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
        queued = set(self._latest)  # every group queued since start (memory or backlog)
        first_new = self._first_id
        rows = [r for r in late.pending if (r.get("receiver"), r.get("group_key")) not in queued]
        # A group queued again since start has a newer message with the current state: the old ones are stale,
        # those of the page and those still on disk alike.
        stale = len(late.pending) - len(rows)
        groups = {(r.get("receiver"), r.get("group_key")) for r in late.latest} & queued
        if groups:
            marks = ("UPDATE outbox SET status = ?, finished = ? WHERE receiver = ? AND group_key = ? AND status = ?"
                     " AND id < ?")
            now = time.time()
            self._submit([(marks, (SUPERSEDED, now, rc, g, PENDING, first_new)) for rc, g in sorted(groups)],
                         "supersede", "superseding stale notifications")  # fmt: skip
        before = len(self._pending)
        counts = {rc: n - sum(1 for r in late.pending if r.get("receiver") == rc and (rc, r.get("group_key")) in
                              queued) for rc, n in late.counts.items()}  # fmt: skip
        self._take_in(rows, counts, [r for r in late.latest if (r.get("receiver"), r.get("group_key")) not in queued],
                      late=True)
        old = len(self._pending) - before
        # Their ids are below every id given out since start: in id order they go first, as they were queued first.
        self._pending = dict(sorted(self._pending.items()))
        self._nflog.merge(late.nflog)
        log.warning(
            "notification database %s: opened late; %d notifications queued before the start resumed, %d replaced by"
            " newer ones (stored silences are used from the next start)",
            self._writer.path,
            old,
            stale,
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
        on_disk = self._backlog.get(receiver, 0) - (before_id not in self._pending)
        if old or on_disk > 0:
            sql = "UPDATE outbox SET status = ?, finished = ? WHERE receiver = ? AND status = ? AND id < ?"
            self._submit(
                [(sql, (SUPERSEDED, now, receiver, PENDING, before_id))], "supersede", "superseding notifications"
            )
        # What is left pending is ``before_id``, the newest: in memory, or the one row still on disk.
        self._backlog[receiver] = 0 if before_id in self._pending else 1
        return len(old) + max(0, on_disk)

    def fail_receiver(self, receiver: str, now: float, error: str) -> int:
        """Fail every pending row of ``receiver`` (no longer configured) in one statement; returns how many."""
        self._merge_late()
        n = self._in_memory.get(receiver, 0) + self._backlog.get(receiver, 0)
        for i in [i for i, r in self._pending.items() if r.receiver == receiver]:
            self._forget(i)
        self._backlog.pop(receiver, None)
        self._cursor.pop(receiver, None)
        for key in [k for k in self._latest if k[0] == receiver]:
            del self._latest[key]
        sql = "UPDATE outbox SET status = ?, finished = ?, last_error = ? WHERE receiver = ? AND status = ?"
        self._submit([(sql, (FAILED, now, error, receiver, PENDING))], "fail",
                     f"failing the notifications of {receiver}")  # fmt: skip
        return n

    def _forget(self, row_id: int) -> None:
        row = self._pending.pop(row_id, None)
        self._stored.pop(row_id, None)
        if row is not None:
            self._in_memory[row.receiver] -= 1
            if self._in_memory[row.receiver] <= 0:
                del self._in_memory[row.receiver]
            key = (row.receiver, row.group_key)
            if key in self._latest and self._latest[key][0] == row_id:
                del self._latest[key]

    def depths(self) -> dict[str, int]:
        """Pending rows per receiver (in memory and on disk)."""
        self._merge_late()
        out = collections.Counter(self._in_memory)
        out.update(self._backlog)
        return {k: v for k, v in out.items() if v > 0}

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
        self._merge_late()
        out = self._nflog.entries()
        for key, (_, entry) in self._latest.items():
            out[key] = entry
        return out

    def effective_entry(self, receiver: str, group_key: str) -> LogEntry | None:
        """As :meth:`effective_entries` for one key."""
        found = self._latest.get((receiver, group_key))
        if found is not None:
            return found[1]
        return self._nflog.get(receiver, group_key)
