"""Writes the disk refuses: the real error said once, nothing masked, held in order, bounded, stored when it can.

``database or disk is full`` is injected through the connection seam (``database.connect``); the real thing, on a
1 MiB tmpfs, is in ``test_disk_full.py``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.notify.store import StateStore, database, writer
from gpuwatchd.notify.store.writer import run_tx

FULL = "database or disk is full"


class Disk:
    """A real connection whose writes fail while ``full``, the way SQLite does: the transaction is already gone."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.full = False

    def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        if self.full and sql.startswith(("INSERT", "UPDATE", "DELETE")):
            self._db.execute("ROLLBACK")  # SQLite rolls the whole transaction back on SQLITE_FULL
            raise sqlite3.OperationalError(FULL)
        return self._db.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> list[Disk]:
    made: list[Disk] = []
    real = database.connect

    def connect(path: Path) -> sqlite3.Connection:
        made.append(Disk(real(path)))
        return made[-1]  # type: ignore[return-value]

    monkeypatch.setattr(database, "connect", connect)
    monkeypatch.setattr(writer, "RETRY_FIRST_SECONDS", 0.02)
    monkeypatch.setattr(writer, "RETRY_MAX_SECONDS", 0.05)
    return made


def test_a_rollback_after_an_automatic_one_does_not_hide_the_error(tmp_path: Path) -> None:
    db = Disk(database.connect(tmp_path / "x.db"))
    db.execute("CREATE TABLE t (x)")
    db.full = True
    with pytest.raises(sqlite3.OperationalError, match=FULL):  # not "cannot rollback - no transaction is active"
        run_tx(db, [("INSERT INTO t VALUES (?)", (1,))])  # type: ignore[arg-type]
    db.full = False
    run_tx(db, [("INSERT INTO t VALUES (?)", (2,))])  # type: ignore[arg-type]
    assert [tuple(r) for r in db.execute("SELECT x FROM t")] == [(2,)]


async def wait_for(cond: Any, what: str) -> None:
    for _ in range(600):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_held_writes_are_stored_in_order_once_the_disk_has_room(
    tmp_path: Path, disk: list[Disk], caplog: pytest.LogCaptureFixture
) -> None:
    state = StateStore(tmp_path)
    box, stats = state.outbox, state.writer.stats
    try:
        kept = box.enqueue("r", "before", "{}", firing=["a"], resolved=[], now=1.0)
        assert await box.stored(kept.id)
        disk[0].full = True
        with caplog.at_level(logging.WARNING, logger="gpuwatchd.notify.store"):
            rows = [box.enqueue("r", f"g{i}", "{}", firing=[f"a{i}"], resolved=[], now=2.0) for i in range(5)]
            for n in range(3):  # retry marks of one row replace each other while held
                box.mark_retry(rows[0].id, 10.0 + n, f"HTTP 503 #{n}")
            box.mark_delivered(rows[1], 3.0, 100.0)
            assert not await box.stored(rows[4].id)  # held in memory: tried, not on disk
            await box.drain()
            assert stats.held_notifications == 5 and not stats.writable
            assert stats.held == 5 + 1 + 1
            assert sum(stats.failures.values()) == 5 + 3 + 1
            # The queue goes on from memory.
            assert box.depths() == {"r": 5} and box.next_pending("r") == box.get(kept.id)
            await asyncio.sleep(0.3)  # several failed retries: still one error line for the episode
            disk[0].full = False
            # The writer thread stores the held writes, then marks the episode over and logs it: wait for all.
            await wait_for(lambda: stats.held == 0 and stats.writable and "writable again" in caplog.text,
                           "the held writes to be stored and the episode logged as over")
        assert stats.writable and stats.held_notifications == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and FULL in errors[0] and "no transaction" not in caplog.text
        assert "writable again" in caplog.text
        stored = {r.group_key: r for r in box.rows()}
        assert [stored[f"g{i}"].status for i in range(5)] == ["pending", "delivered", "pending", "pending", "pending"]
        assert stored["g0"].attempts == 3 and stored["g0"].last_error == "HTTP 503 #2"
    finally:
        state.close()
    again = StateStore(tmp_path)
    try:
        assert again.outbox.depths() == {"r": 5}  # kept + g0, g2, g3, g4
    finally:
        again.close()


async def test_held_writes_are_bounded(tmp_path: Path, disk: list[Disk], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "MAX_HELD_BYTES", 10_000)
    monkeypatch.setattr(writer, "RETRY_FIRST_SECONDS", 3600.0)
    state = StateStore(tmp_path)
    try:
        disk[0].full = True
        for i in range(20):
            state.outbox.enqueue("r", f"g{i}", "x" * 1000, firing=[], resolved=[], now=1.0)
        await state.outbox.drain()
        stats = state.writer.stats
        assert 0 < stats.held < 20 and stats.dropped == 20 - stats.held
        assert stats.held_notifications == stats.held
        assert state.outbox.depths() == {"r": 20}  # delivery still has them all, from memory
    finally:
        state.close()


async def test_an_error_no_retry_can_fix_is_not_held(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = StateStore(tmp_path)
    try:
        with sqlite3.connect(state.path) as other:  # another program broke a constraint the outbox relies on
            for i in (1, 2):
                other.execute(
                    "INSERT INTO outbox (id, receiver, group_key, idempotency_key, payload, firing, resolved, created,"
                    f" next_attempt, status) VALUES ({i}, 'x', 'x', 'k{i}', '{{}}', '[]', '[]', 0, 0, 'delivered')"
                )
        other.close()
        rows = [state.outbox.enqueue("r", f"g{i}", "{}", firing=[], resolved=[], now=1.0) for i in (1, 2)]
        assert [await state.outbox.stored(r.id) for r in rows] == [False, False]  # ids 1 and 2 again: refused
        stats = state.writer.stats
        assert stats.dropped == 2 and stats.held == 0 and stats.writable
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        said = [m for m in errors if "UNIQUE constraint failed" in m]
        assert len(said) == 1  # the same refusal again is not logged again
        nxt = state.outbox.enqueue("r", "g2", "{}", firing=[], resolved=[], now=1.0)
        assert await state.outbox.stored(nxt.id)  # later writes are not blocked behind it
    finally:
        state.close()


class Unopenable:
    """A connection on a disk too full to open a WAL database: every statement fails while ``full``."""

    full = True

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        if Unopenable.full:
            raise sqlite3.OperationalError(FULL)
        return self._db.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_disk_full_at_start_runs_from_memory_then_merges_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = StateStore(tmp_path)
    old = [before.outbox.enqueue("r", f"g{i}", "{}", firing=[f"a{i}"], resolved=[], now=1.0) for i in range(3)]
    before.nflog.write("r", "told", firing=["t"], resolved=[], now=1.0, expires=1e12)
    before.close()

    real = database.connect
    monkeypatch.setattr(database, "connect", lambda path: Unopenable(real(path)))
    monkeypatch.setattr(writer, "RETRY_FIRST_SECONDS", 0.02)
    monkeypatch.setattr(writer, "RETRY_MAX_SECONDS", 0.05)
    Unopenable.full = True
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.notify.store"):
        state = StateStore(tmp_path)  # starts: nothing readable, nothing moved aside
    try:
        stats, box = state.writer.stats, state.outbox
        assert state.recovered is None and not stats.writable
        assert box.depths() == {} and box.rows() == []  # memory only, and a read fails softly
        newer = box.enqueue("r", "g1", "{}", firing=["a1", "b"], resolved=[], now=2.0)  # g1 again, newer state
        extra = box.enqueue("r", "g9", "{}", firing=["a9"], resolved=[], now=2.0)
        assert newer.id > old[-1].id and not await box.stored(extra.id)
        assert stats.held_notifications == 2
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "opening it failed" in errors[0] and FULL in errors[0]
        assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]

        Unopenable.full = False
        await wait_for(lambda: stats.held == 0 and stats.writable, "the file to open and the held writes to follow")
        assert box.depths() == {"r": 4}  # g0, g2 from the file; g1 (newer) and g9 from memory
        head = box.next_pending("r")
        assert head is not None and head.id == old[0].id  # queued first, delivered first
        entries = state.outbox.effective_entries()
        assert entries[("r", "g1")].firing == frozenset({"a1", "b"}) and ("r", "told") in entries
        await box.drain()
        status = {r.id: r.status for r in box.rows()}
        assert status[old[1].id] == "superseded" and status[newer.id] == status[extra.id] == "pending"
    finally:
        state.close()
