"""The state database file: schema, connection settings, and the start-up check that moves a broken file aside.

A damaged ``gpuwatchd.db`` (truncated, pages overwritten, another program's schema) must not keep the daemon from
starting: systemd would restart it into the same failure forever. So opening checks the file (``PRAGMA
quick_check``, the expected columns, a full read of what start-up loads) and, when any of that fails, renames the
file with its ``-wal``/``-shm`` to ``gpuwatchd.db.corrupt-<UTC time>`` and starts with an empty database. A single
unreadable *row* is not a broken file: the stores skip it when they build their records (see ``records.py``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatchd.runtime.startup import StateDirError

log = logging.getLogger(__name__)

DB_NAME = "gpuwatchd.db"
SIDE_FILES = ("-wal", "-shm", "-journal")
# Beside the file after a clean close: its identity then (``stamp_clean``).
CLEAN_STAMP = ".clean"
COLUMNS: dict[str, tuple[str, ...]] = {
    "outbox": (
        "id",
        "receiver",
        "group_key",
        "idempotency_key",
        "payload",
        "firing",
        "resolved",
        "created",
        "attempts",
        "next_attempt",
        "status",
        "last_error",
        "finished",
    ),
    "nflog": ("receiver", "group_key", "firing", "resolved", "timestamp", "expires"),
    "silences": ("id", "matchers", "starts_at", "ends_at", "created_by", "comment", "updated_at"),
}
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
CREATE INDEX IF NOT EXISTS outbox_group ON outbox (receiver, group_key, status, id);
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
PENDING = "pending"
# Ids are assigned by the outbox, not by SQLite, so enqueue can return at once; never reuse one (AUTOINCREMENT's
# rule), hence the sequence table too.
_LAST_ID_SQL = (
    "SELECT MAX(COALESCE((SELECT MAX(id) FROM outbox), 0),"
    " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0))"
)
# The WAL is reset only by a checkpoint, which by default waits for 1000 pages (4 MiB): on a small or full file
# system it would grow until every write fails. Checkpoint early and truncate what is left over.
WAL_AUTOCHECKPOINT_PAGES = 100
JOURNAL_SIZE_LIMIT_BYTES = 1 << 20


# Pending rows of one receiver held in memory (payloads included); the rest stay on disk until the worker gets to
# them. 256 Slack-sized messages are ~1 MB, and 4+ minutes of sending at the default 60 a minute.
PAGE_ROWS = 256
# Receivers whose first page is read at start (in name order); any other is paged in by its worker.
START_PAGES = 64
# Groups whose newest pending row is remembered for dedup (a host has a few dozen; the bound is for a hostile file).
MAX_LATEST_GROUPS = 10_000
# Largest notification stored or sent, in bytes: Slack takes 40,000 characters of text, Teams 28 KB, Discord 6,000
# characters; a webhook carrying a fleet's alerts stays far below. A stored row over it is not sent (it is failed,
# logged), and one over it is never stored: a 50 MiB row was POSTed as is.
MAX_PAYLOAD_BYTES = 1 << 20


class Damaged(Exception):
    """The database file cannot be used as it is; ``reason`` is the metric label (corrupt, schema)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class Loaded:
    """What start-up reads from the database: raw rows (plain dicts) for the stores to build records from.

    Of the outbox, only a first page of each receiver's pending rows (``PAGE_ROWS``, oldest first), the pending
    count per receiver, and the newest pending row of each group without its payload (for dedup): a long outage
    leaves hundreds of thousands of rows, and holding them all took 805 MB and 10 s at start (200k rows). The
    delivery workers page in the rest as they drain (``Outbox.refill``).
    """

    pending: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    latest: list[dict[str, Any]] = field(default_factory=list)
    nflog: list[dict[str, Any]] = field(default_factory=list)
    silences: list[dict[str, Any]] = field(default_factory=list)
    last_id: int = 0
    recovered: str | None = None  # reason the file was moved aside at this start
    moved_to: Path | None = None


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the daemon's settings (autocommit: transactions are explicit BEGIN/COMMIT)."""
    # check_same_thread stays on: the connection is created and used by the writer thread only.
    db = sqlite3.connect(path, isolation_level=None)
    db.row_factory = sqlite3.Row
    return db


def _prepare(db: sqlite3.Connection) -> None:
    # Durability: WAL with synchronous=FULL. NORMAL already survives a killed process; FULL also survives a host
    # crash or power cut, which is the failure a GPU falling off the bus can cause.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
    # Other subsystems may share the file: wait for their write locks rather than fail.
    db.execute("PRAGMA busy_timeout=5000")


def _identity(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def stamp_clean(path: Path) -> None:
    """After a clean close: note the file as it is (device, inode, size, mtime), so the next start can skip the
    whole-file check when nothing touched it since (``quick_check`` reads every page: seconds for a big outbox)."""
    try:
        Path(f"{path}{CLEAN_STAMP}").write_text(_identity(path), encoding="ascii")
    except OSError as e:
        log.debug("cannot stamp %s as closed cleanly: %s", path, e)


def _unchanged_since_clean_close(path: Path) -> bool:
    """Whether the file is exactly as a clean close left it (no WAL left over). The stamp is used up either way:
    a crash from here on leaves none, so the next start checks."""
    stamp = Path(f"{path}{CLEAN_STAMP}")
    try:
        noted = stamp.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return False
    try:
        stamp.unlink()
        wal = Path(f"{path}-wal")
        return noted == _identity(path) and (not wal.exists() or wal.stat().st_size == 0)
    except OSError:
        return False


def _check(db: sqlite3.Connection, *, whole_file: bool = True) -> None:
    # Errors raised here are sorted by the caller: a full disk or an I/O error is not damage.
    found = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()] if whole_file else ["ok"]
    if found != ["ok"]:
        raise Damaged("corrupt", "quick_check: " + "; ".join(str(x) for x in found[:3]))
    for table, want in COLUMNS.items():
        have = tuple(r[1] for r in db.execute(f"PRAGMA table_info({table})").fetchall())
        if have and have != want:
            raise Damaged("schema", f"table {table} has columns {', '.join(have)}, expected {', '.join(want)}")


_PAGE_SQL = (
    "SELECT id, receiver, group_key, idempotency_key, firing, resolved, created, attempts, next_attempt, status,"
    " last_error, finished, length(CAST(payload AS BLOB)) AS payload_bytes,"
    " CASE WHEN length(CAST(payload AS BLOB)) > ? THEN NULL ELSE payload END AS payload"
    " FROM outbox WHERE receiver = ? AND status = ? AND id > ? ORDER BY id LIMIT ?"
)


def page_rows(db: sqlite3.Connection, receiver: str, after: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` pending rows of ``receiver`` with ids above ``after``, oldest first. A payload over
    ``MAX_PAYLOAD_BYTES`` is not read: the row comes with ``payload`` None and its size in ``payload_bytes``."""
    args = (MAX_PAYLOAD_BYTES, receiver, PENDING, after, limit)
    return [dict(r) for r in db.execute(_PAGE_SQL, args).fetchall()]


def _latest(db: sqlite3.Connection) -> list[dict[str, Any]]:
    """The newest pending row of each group, without its payload: the ids from the group index (no table scan),
    then those rows."""
    ids = [int(r[0]) for r in db.execute(
        "SELECT MAX(id) FROM outbox WHERE status = ? GROUP BY receiver, group_key LIMIT ?", (PENDING, MAX_LATEST_GROUPS)
    ).fetchall()]  # fmt: skip
    sql = "SELECT receiver, group_key, firing, resolved, created, id FROM outbox WHERE id = ?"
    return [dict(r) for i in ids for r in db.execute(sql, (i,)).fetchall()]


def _load(db: sqlite3.Connection) -> Loaded:
    def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in db.execute(sql, args).fetchall()]

    counts = {str(r[0]): int(r[1]) for r in db.execute(
        "SELECT receiver, COUNT(*) FROM outbox WHERE status = ? GROUP BY receiver ORDER BY receiver", (PENDING,)
    ).fetchall()}  # fmt: skip
    pending: list[dict[str, Any]] = []
    for receiver in list(counts)[:START_PAGES]:
        pending.extend(page_rows(db, receiver, 0, PAGE_ROWS))
    pending.sort(key=lambda r: r["id"])
    return Loaded(
        pending=pending,
        counts=counts,
        latest=_latest(db),
        nflog=rows("SELECT * FROM nflog"),
        silences=rows("SELECT * FROM silences ORDER BY starts_at, id"),
        last_id=int(db.execute(_LAST_ID_SQL).fetchone()[0] or 0),
    )


def _try_open(path: Path) -> tuple[sqlite3.Connection, Loaded]:
    clean = _unchanged_since_clean_close(path)
    db = connect(path)
    try:
        try:
            _check(db, whole_file=not clean)
            _prepare(db)
            db.executescript(SCHEMA)
            return db, _load(db)
        except sqlite3.OperationalError as e:
            if not _looks_damaged(e):
                raise  # locked, disk full, I/O: not a reason to throw the data away
            raise Damaged("corrupt", str(e)) from None
        except (sqlite3.DatabaseError, ValueError, TypeError) as e:  # malformed pages, a wrong-typed id
            raise Damaged("corrupt", str(e)) from None
    except BaseException:
        db.close()
        raise


def _looks_damaged(e: sqlite3.OperationalError) -> bool:
    text = str(e).lower()
    return any(s in text for s in ("malformed", "not a database", "no such column", "no such table", "corrupt"))


def quarantine(path: Path, now: float | None = None) -> Path:
    """Rename ``path`` and its side files to ``<name>.corrupt-<UTC time>[.n]``; returns the new main path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while any(Path(f"{base}{'' if n == 0 else f'.{n}'}{s}").exists() for s in ("", *SIDE_FILES)):
        n += 1
    target = Path(f"{base}{'' if n == 0 else f'.{n}'}")
    # Side files first: a main file left without its WAL would look valid but lose the committed tail.
    for suffix in (*SIDE_FILES, ""):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.rename(src, Path(f"{target}{suffix}"))
    return target


def open_database(
    path: Path, *, opener: Callable[[Path], tuple[sqlite3.Connection, Loaded]] = _try_open
) -> tuple[sqlite3.Connection, Loaded]:
    """Open (creating if needed) and load; a damaged file is moved aside and replaced by an empty one, once."""
    try:
        return opener(path)
    except Damaged as e:
        try:
            moved = quarantine(path)
        except OSError as oe:
            raise StateDirError(
                f"state_dir: the notification database {path} is damaged ({e}) and cannot be moved aside: {oe}"
            ) from None
        log.error(
            "notification database %s is damaged (%s: %s); moved it to %s and starting with empty state"
            " (queued notifications, notification log and silences in it are not used)",
            path,
            e.reason,
            e,
            moved,
        )
        db, loaded = opener(path)
        loaded.recovered, loaded.moved_to = e.reason, moved
        return db, loaded
