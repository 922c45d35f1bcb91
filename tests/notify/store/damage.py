"""Damaged state databases, written at test time: a real database made by the daemon's own code, then broken.

Each ``damage(state_dir)`` leaves ``state_dir/gpuwatchd.db`` in one of the states found in the field. ``MOVED``
ones must be moved aside at start (the value is the reason label); ``SKIPPED`` ones hold one bad row among good ones
(the value is the table), and the file must be kept.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gpuwatchd.notify.store import DB_NAME, StateStore

PAGE = 4096
NOW = 1_800_000_000.0
GOOD_MATCHERS = json.dumps([{"name": "uuid", "op": "=", "value": "GPU-1"}])


def make_good(state_dir: Path, rows: int = 40) -> Path:
    """A database with ``rows`` pending notifications, a log entry and a silence, checkpointed into the main file."""
    state = StateStore(state_dir)
    for i in range(rows):
        state.outbox.enqueue(
            "r", f"g{i}", json.dumps({"text": "x" * 400, "i": i}), firing=[f"a{i}"], resolved=[], now=NOW
        )
    state.nflog.write("r", "logged", firing=["z"], resolved=[], now=NOW, expires=NOW + 3600)
    state.silences.save(
        "good1", GOOD_MATCHERS, starts_at=NOW, ends_at=NOW + 3600, created_by="ops", comment="", now=NOW
    )
    state.close()  # the last connection closing checkpoints the WAL into the file
    return state_dir / DB_NAME


def truncated(state_dir: Path) -> None:
    db = make_good(state_dir)
    with db.open("r+b") as f:
        f.truncate(PAGE + 1000)  # mid-page, like a copy cut short by a full disk


def random_pages(state_dir: Path) -> None:
    db = make_good(state_dir)
    rng = random.Random(11)
    with db.open("r+b") as f:
        size = f.seek(0, 2)
        for page in range(1, size // PAGE):  # every page but the header's: tables and index trees
            f.seek(page * PAGE)
            f.write(rng.randbytes(PAGE))


def not_a_database(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / DB_NAME).write_bytes(random.Random(5).randbytes(3 * PAGE))


def wrong_schema(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY, message BLOB)")
        db.execute("INSERT INTO outbox VALUES (1, x'00')")
    db.close()


def bad_json_row(state_dir: Path) -> None:
    db = make_good(state_dir)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE outbox SET firing = '[{' WHERE id = 3")
    c.close()


def bad_regex_row(state_dir: Path) -> None:
    db = make_good(state_dir)
    backreference = json.dumps([{"name": "uuid", "op": "=~", "value": "(x)\\1"}])  # RE2 has no backreferences
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO silences VALUES ('bad1', ?, ?, ?, 'ops', '', ?)", (backreference, NOW, NOW + 3600, NOW))
    c.close()


MOVED: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (truncated, "corrupt"),
    "random-pages": (random_pages, "corrupt"),
    "not-a-database": (not_a_database, "corrupt"),
    "wrong-schema": (wrong_schema, "schema"),
}
SKIPPED: dict[str, tuple[Callable[[Path], None], str]] = {
    "bad-json-row": (bad_json_row, "outbox"),
    "bad-regex-row": (bad_regex_row, "silences"),
}
