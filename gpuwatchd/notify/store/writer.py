"""The one thread that owns the SQLite connection: every commit (and its fsync) happens here, off the event loop.

On a slow or busy disk an fsync can take seconds; on the event loop that would stall ``/metrics`` and the systemd
watchdog. So the connection belongs to this thread, fed in order through a queue, and the stores answer the
loop's questions from in-memory mirrors updated at once by every write.

When a write fails for a reason that can pass (``database or disk is full``, an I/O error, a lock held too long),
it is kept in memory, and so is every later write (in order: an update must not land before the insert it
updates). The thread retries the oldest held write with backoff; once one commits, the rest follow. The real
SQLite error is logged once per episode (and once more when the disk is writable again), and counted. The held
writes are bounded (``MAX_HELD_BYTES``): past it the oldest are dropped, counted and logged. What a SIGKILL loses
while writes are held is exactly the held writes (docs/notifications.md, "When the state directory is full").
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuwatchd.notify.store import database
from gpuwatchd.notify.store.database import Loaded

log = logging.getLogger(__name__)
T = TypeVar("T")

Statement = tuple[str, tuple[Any, ...]]
# Held writes waiting for the disk: what a full disk may cost in memory, at most (oldest dropped beyond).
MAX_HELD_BYTES = 64 << 20
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 5.0
# Op label of a write that stores a new notification: held ones are the "only in memory" gauge.
ENQUEUE = "enqueue"


@dataclass(eq=False)
class Write:
    """One transaction; ``future`` says True once committed, False if held in memory or dropped."""

    statements: tuple[Statement, ...]
    op: str
    what: str
    key: Hashable | None = None  # a later held write with the same key replaces this one (it carries the latest values)
    future: concurrent.futures.Future[bool] = field(default_factory=concurrent.futures.Future)
    size: int = 0

    def __post_init__(self) -> None:
        self.size = sum(
            len(sql) + sum(len(a) if isinstance(a, str) else 8 for a in args) for sql, args in self.statements
        )


@dataclass(eq=False)
class _Query:
    fn: Callable[[sqlite3.Connection], Any]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


@dataclass
class WriterStats:
    """Counters and gauges of the writer, read (without locking: ints) by the metrics collector."""

    failures: collections.Counter[str] = field(default_factory=collections.Counter)  # writes not committed when made
    dropped: int = 0  # held writes given up (bound exceeded, or an error no retry can fix)
    held: int = 0
    held_notifications: int = 0
    writable: bool = True


def run_tx(db: sqlite3.Connection, statements: Sequence[Statement]) -> None:
    """One explicit transaction. Rolls back only if one is still open: after ``SQLITE_FULL`` SQLite may have rolled
    back on its own, and a blind ROLLBACK would raise "no transaction is active" and hide the real error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for sql, args in statements:
            db.execute(sql, args)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error as e:  # the original error is the one worth raising
                log.debug("rollback after a failed write: %s", e)
        raise


def unopened_id_base() -> int:
    """First outbox id when the file cannot be read at start: above any id it holds (those count up from 1 by one per
    notification, so they stay far below milliseconds since 1970), so held inserts cannot collide with them and the
    rows from before sort (and are delivered) first."""
    return int(time.time() * 1000)


def _transient(e: sqlite3.Error) -> bool:
    # Full disk, I/O error, busy/locked: may pass. A constraint or a malformed page will not.
    return isinstance(e, sqlite3.OperationalError) and "malformed" not in str(e)


class DbWriter:
    """Owns the connection and the thread. Methods are called from one thread (the event loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stats = WriterStats()
        self._jobs: queue.SimpleQueue[Write | _Query | None] = queue.SimpleQueue()
        ready: concurrent.futures.Future[Loaded] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="gpuwatchd-state-db", daemon=True)
        self._thread.start()
        # A database that cannot be opened even after moving it aside fails here, at start-up.
        self.loaded = ready.result()
        # Set once by the thread if the file could only be opened after start (disk full at start).
        self.late_loaded: Loaded | None = None
        # A writer dropped without close() still lets its thread finish the queue and exit.
        self._stop = weakref.finalize(self, self._jobs.put, None)
        self._closed = False
        self._last: concurrent.futures.Future[bool] | None = None

    def close(self) -> None:
        """Finish the queued writes (blocking; held ones get one last try) and close the database."""
        if not self._closed:
            self._closed = True
            self._stop()
            self._thread.join()

    def submit(self, write: Write) -> concurrent.futures.Future[bool]:
        if self._closed:
            raise RuntimeError(f"state database closed: cannot {write.what}")
        self._jobs.put(write)
        self._last = write.future
        return write.future

    def query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the thread after every queued write and wait for it (tests, diagnostics)."""
        if self._closed:
            raise RuntimeError("state database closed")
        q = _Query(fn)
        self._jobs.put(q)
        return q.future.result()  # type: ignore[no-any-return]

    async def query_async(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``query`` for the event loop: waits without blocking it."""
        if self._closed:
            raise RuntimeError("state database closed")
        q = _Query(fn)
        self._jobs.put(q)
        result: T = await asyncio.wrap_future(q.future)
        return result

    def holding(self) -> bool:
        """On the thread (inside a query): whether writes are held in memory, so the file lacks some."""
        return bool(self._held) or self._db is None

    def take_late_loaded(self) -> Loaded | None:
        """What a late open read from the file (once; the loop merges it into memory), else None."""
        late = self.late_loaded
        if late is not None:
            self.late_loaded = None  # the thread sets it once only, before any later read here
        return late

    def settled(self) -> bool:
        """Whether every write submitted so far was tried (committed, or held/dropped and counted)."""
        return self._last is None or self._last.done()

    async def drain(self) -> None:
        """Wait until every write submitted so far was tried."""
        if self._last is not None:
            await asyncio.wait([asyncio.wrap_future(self._last)])

    # -- the thread -----------------------------------------------------------------------------------------------
    def _serve(self, ready: concurrent.futures.Future[Loaded]) -> None:
        self._held: collections.deque[Write] = collections.deque()
        self._held_bytes = 0
        self._retry_at = 0.0
        self._delay = RETRY_FIRST_SECONDS
        self._episode: tuple[float, int] | None = None  # (start, writes committed late so far)
        self._db: sqlite3.Connection | None = None
        self._last_refusal: str | None = None
        try:
            self._db, loaded = database.open_database(self.path)
        except sqlite3.OperationalError as e:
            # Full disk or I/O error at start (SQLite needs room for its -wal and -shm): run from memory, hold every
            # write, keep trying to open; what the file holds is merged in when it opens (take_late_loaded).
            loaded = Loaded(last_id=unopened_id_base())
            self._start_episode(
                f"opening it failed: {e}; starting with empty state in memory (what the file holds is"
                " used once it opens)"
            )
        except BaseException as e:  # handed to the constructor, which raises it at start-up
            ready.set_exception(e)
            return
        ready.set_result(loaded)
        try:
            while True:
                waiting = self._held or self._db is None
                timeout = max(0.0, self._retry_at - time.monotonic()) if waiting else None
                try:
                    job = self._jobs.get(timeout=timeout)
                except queue.Empty:
                    pass  # time to retry the held writes
                else:
                    if job is None:
                        break
                    if isinstance(job, _Query):
                        self._run_query(job)
                    else:
                        try:
                            self._write(job)
                        except Exception:  # a bug here must not end the thread: every later drain() would hang
                            log.exception("notification database %s: %s failed unexpectedly", self.path, job.what)
                            if not job.future.done():
                                job.future.set_result(False)
                if (self._held or self._db is None) and time.monotonic() >= self._retry_at:
                    self._retry()
            if self._held:
                self._retry()
            if self._held:
                log.error(
                    "notification database %s: stopping with %d writes not stored (%d notifications); they are lost",
                    self.path,
                    len(self._held),
                    self.stats.held_notifications,
                )
        finally:
            if self._db is not None:
                self._db.close()
                if not self._held:
                    database.stamp_clean(self.path)

    def _run_query(self, q: _Query) -> None:
        if not q.future.set_running_or_notify_cancel():
            return
        try:
            if self._db is None:
                raise sqlite3.OperationalError("the database could not be opened yet")
            q.future.set_result(q.fn(self._db))
        except Exception as e:
            q.future.set_exception(e)

    def _write(self, w: Write) -> None:
        if self._held or self._db is None:
            self.stats.failures[w.op] += 1
            self._hold(w)
            return
        try:
            run_tx(self._db, w.statements)
        except sqlite3.Error as e:
            self.stats.failures[w.op] += 1
            if not _transient(e):
                self.stats.dropped += 1
                self._refused(w, e, "kept in memory only")
                w.future.set_result(False)
                return
            self._start_episode(f"{w.what} failed: {e}; keeping this and later writes in memory and retrying")
            self._hold(w)
            return
        self._last_refusal = None
        w.future.set_result(True)

    def _refused(self, w: Write, e: sqlite3.Error, outcome: str) -> None:
        # A file damaged while running refuses every write the same way: say it once, not once per write.
        text = str(e)
        level = logging.DEBUG if text == self._last_refusal else logging.ERROR
        self._last_refusal = text
        log.log(level, "notification database %s: %s failed: %s; %s", self.path, w.what, e, outcome)

    def _start_episode(self, what: str) -> None:
        self._episode = (time.monotonic(), 0)
        self._delay = RETRY_FIRST_SECONDS
        self._retry_at = time.monotonic() + self._delay
        self.stats.writable = False
        log.error(
            "notification database %s: %s (a crash now loses what is held; see gpuwatchd_state_db_writes_held)",
            self.path,
            what,
        )

    def _hold(self, w: Write) -> None:
        if w.key is not None:
            for i, old in enumerate(self._held):
                if old.key == w.key:
                    self._held[i] = w
                    self._held_bytes += w.size - old.size
                    self._count()
                    w.future.set_result(False)
                    return
        self._held.append(w)
        self._held_bytes += w.size
        while self._held_bytes > MAX_HELD_BYTES and len(self._held) > 1:
            old = self._held.popleft()
            self._held_bytes -= old.size
            self.stats.dropped += 1
            log.error("notification database %s: too much held in memory; dropped %s", self.path, old.what)
        self._count()
        w.future.set_result(False)

    def _count(self) -> None:
        self.stats.held = len(self._held)
        self.stats.held_notifications = sum(w.op == ENQUEUE for w in self._held)

    def _backoff(self) -> None:
        self._delay = min(RETRY_MAX_SECONDS, self._delay * 2)
        self._retry_at = time.monotonic() + self._delay

    def _retry(self) -> None:
        if self._db is None:
            try:
                self._db, late = database.open_database(self.path)
            except sqlite3.OperationalError as e:
                log.debug("opening the database, still: %s", e)
                self._backoff()
                return
            except Exception as e:  # damaged and cannot be moved aside (already said why): keep holding
                log.error("notification database %s: cannot open: %s", self.path, e)
                self._backoff()
                return
            self.late_loaded = late
            log.warning("notification database %s: opened; merging what it holds", self.path)
        db = self._db
        while self._held:
            w = self._held[0]
            try:
                run_tx(db, w.statements)
            except sqlite3.Error as e:
                if not _transient(e):
                    self._held.popleft()
                    self._held_bytes -= w.size
                    self.stats.dropped += 1
                    self._refused(w, e, "dropped")
                    continue
                # A full WAL only shrinks at a checkpoint: try one, so freed space is usable at the next try.
                try:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error as ce:
                    log.debug("checkpoint while the disk is full: %s", ce)
                self._backoff()
                self._count()
                return
            self._held.popleft()
            self._held_bytes -= w.size
            if self._episode is not None:
                self._episode = (self._episode[0], self._episode[1] + 1)
        self._count()
        self.stats.writable = True
        if self._episode is not None:
            start, n = self._episode
            log.warning(
                "notification database %s: writable again after %.0fs; stored %d held writes",
                self.path,
                time.monotonic() - start,
                n,
            )
            self._episode = None
