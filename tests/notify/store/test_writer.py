"""The state database writes on its own thread: a slow disk does not stall the event loop, durability is unchanged.

A slow fsync is played by a connection whose ``COMMIT`` sleeps (SQLite fsyncs inside COMMIT with
``synchronous=FULL``); a broken disk by one whose ``COMMIT`` raises. Both wrap the real connection.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.notify.store import DB_NAME, StateStore, database
from gpuwatchd.runtime.clock import ManualClock
from tests.notify.conftest import Request, Sink, make_dispatcher, mk_alert, notify_config, receiver, settle

DELAY = 0.5  # injected per commit; the loop lag must stay well below it
LAG_LIMIT = DELAY / 2


class SlowCommit:
    """A real connection whose COMMIT first runs ``before_commit`` (sleep, or raise)."""

    def __init__(self, db: sqlite3.Connection, before_commit: Callable[[], None]) -> None:
        self._db = db
        self._before = before_commit
        self.commits = 0

    def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self.commits += 1
            self._before()
        return self._db.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SlowCommit]]:
    made: list[SlowCommit] = []
    real_connect = database.connect

    def slow_connect(path: Path) -> sqlite3.Connection:
        c = SlowCommit(real_connect(path), lambda: time.sleep(DELAY))
        made.append(c)
        return c  # type: ignore[return-value]

    monkeypatch.setattr(database, "connect", slow_connect)
    yield made


class LagProbe:
    """How late a 10 ms sleep on the loop wakes up, at worst."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - t0 - 0.01)

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_slow_commits_do_not_block_the_loop(tmp_path: Path, slow_disk: list[SlowCommit]) -> None:
    state = StateStore(tmp_path)
    box = state.outbox
    try:
        with LagProbe() as probe:
            rows = [box.enqueue("r", f"g{i}", "{}", firing=[f"a{i}"], resolved=[], now=float(i)) for i in range(3)]
            box.mark_delivered(rows[0], 10.0, 100.0)
            box.mark_retry(rows[1].id, 20.0, "HTTP 500")
            state.nflog.write("r", "quiet", firing=[], resolved=["z"], now=11.0, expires=100.0)
            state.silences.save("s1", "[]", starts_at=0.0, ends_at=50.0, created_by="me", comment="", now=1.0)
            # The hot path answers at once from memory, before anything is on disk.
            assert box.depths() == {"r": 2}
            head = box.next_pending("r")
            assert head is not None and head.id == rows[1].id and head.attempts == 1
            assert not box.settled()
            await box.drain()
        assert slow_disk[0].commits >= 5  # every write really went through the slow commit
        assert probe.worst < LAG_LIMIT, f"event loop stalled {probe.worst:.3f}s behind a {DELAY}s commit"
        assert box.settled()
        assert [r.status for r in box.rows()] == ["delivered", "pending", "pending"]
        assert box.rows()[1].last_error == "HTTP 500" and box.rows()[1].next_attempt == 20.0
    finally:
        state.close()


async def test_stored_before_first_attempt_on_a_slow_disk(
    sink: Sink, tmp_path: Path, clock: ManualClock, slow_disk: list[SlowCommit]
) -> None:
    """Through the dispatcher: the request goes out only once its row is committed, and the loop keeps moving."""
    seen: list[list[tuple[str, str]]] = []

    def respond(req: Request) -> Any:
        # A second, independent connection sees only what is committed.
        with sqlite3.connect(tmp_path / DB_NAME) as other:
            seen.append(other.execute("SELECT idempotency_key, status FROM outbox ORDER BY id").fetchall())
        from aiohttp import web

        return web.Response(text="ok")

    sink.responder = respond
    config = notify_config([receiver("hook", "webhook", sink.url)], group_wait="0s", routes=[], group_by=["uuid"])
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        with LagProbe() as probe:
            d.update([mk_alert(t=clock.now()), mk_alert(uuid="GPU-2", gpu="2", t=clock.now())])
            reqs = await settle(d, sink, 2)
        assert probe.worst < LAG_LIMIT, f"event loop stalled {probe.worst:.3f}s behind a {DELAY}s commit"
        keys = [r.headers["Idempotency-Key"] for r in reqs]
        # Each request's row was on disk when it arrived; the first was committed delivered before the second left.
        assert (keys[0], "pending") in seen[0]
        assert (keys[0], "delivered") in seen[1] and (keys[1], "pending") in seen[1]
    finally:
        await d.stop()
    with sqlite3.connect(tmp_path / DB_NAME) as other:
        assert other.execute("SELECT status FROM outbox").fetchall() == [("delivered",), ("delivered",)]


async def test_a_failing_disk_is_logged_once_delivery_goes_on_and_the_writes_follow_later(
    sink: Sink, tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_connect = database.connect
    broken = False

    def fail() -> None:
        if broken:
            raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(database, "connect", lambda path: SlowCommit(real_connect(path), fail))
    config = notify_config([receiver("hook", "webhook", sink.url)], group_wait="0s", routes=[])
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        broken = True
        with caplog.at_level(logging.ERROR, logger="gpuwatchd.notify.store"):
            d.update([mk_alert(t=clock.now())])
            await settle(d, sink, 1)  # an alert still reaches its receiver when the disk fails
            await d.outbox.drain()
        stats = d.state.writer.stats
        assert stats.failures["enqueue"] == 1 and stats.failures["deliver"] == 1
        assert stats.held >= 2 and stats.held_notifications == 1 and not stats.writable  # (+ the first gc)
        # The real error, once for the episode, and never the rollback's "no transaction is active".
        assert caplog.text.count("disk I/O error") == 1
        assert "storing notification 1 failed: disk I/O error; keeping this and later writes in memory" in caplog.text
        assert "no transaction is active" not in caplog.text
        assert d.outbox.depths() == {}
        broken = False
        for _ in range(400):  # the writer retries on its own (backoff up to writer.RETRY_MAX_SECONDS)
            if stats.held == 0:
                break
            await asyncio.sleep(0.05)
        assert stats.writable and stats.held_notifications == 0
        # Stored late but in order: the insert, then its delivered mark.
        assert [r.status for r in d.outbox.rows()] == ["delivered"]
        assert len(sink.requests) == 1
    finally:
        await d.stop()


async def test_restart_restores_queue_and_log_and_never_reuses_an_id(tmp_path: Path) -> None:
    state = StateStore(tmp_path)
    box = state.outbox
    a = box.enqueue("r", "g1", "{}", firing=["x"], resolved=[], now=1.0)
    b = box.enqueue("r", "g2", "{}", firing=["y"], resolved=[], now=2.0)
    c = box.enqueue("r", "g3", "{}", firing=["z"], resolved=[], now=3.0)
    box.mark_delivered(a, 5.0, 1000.0)
    box.mark_failed(c.id, 5.0, "gone")
    box.gc(10.0, 1.0)  # removes the finished rows a and c (c had the highest id)
    state.close()

    state = StateStore(tmp_path)
    box = state.outbox
    try:
        assert box.depths() == {"r": 1}
        head = box.next_pending("r")
        assert head is not None and head.idempotency_key == b.idempotency_key
        entries = box.effective_entries()
        assert entries[("r", "g1")].firing == frozenset({"x"})  # delivered: from the log
        assert entries[("r", "g2")].firing == frozenset({"y"})  # queued: from the outbox
        d = box.enqueue("r", "g4", "{}", firing=[], resolved=[], now=11.0)
        assert d.id > c.id
        assert await box.stored(d.id)
    finally:
        state.close()
    with pytest.raises(RuntimeError, match="state database closed"):
        state.nflog.write("r", "g", firing=[], resolved=[], now=0.0, expires=1.0)
