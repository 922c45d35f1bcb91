"""A long outage's outbox in a real SQLite file: memory holds a page per receiver, the rest is paged in as the
worker drains, every row is delivered once and in order; rows of a receiver no longer configured are failed in
one statement; a stored row over the size cap is failed, not sent, and none over it is stored."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from until import until

from gpuwatchd.notify.store import StateStore, database, outbox
from gpuwatchd.notify.store.database import DB_NAME, MAX_PAYLOAD_BYTES, SCHEMA, connect
from gpuwatchd.notify.store.outbox import PayloadTooLarge
from gpuwatchd.runtime.clock import ScaledClock
from tests.notify.conftest import Sink, make_dispatcher, mk_alert, notify_config, receiver

PAGE = 16


def fill(state_dir: Path, rows: list[tuple[str, str, str]], now: float) -> None:
    """Pending rows (receiver, group key, payload) as a previous daemon left them."""
    state_dir.mkdir(parents=True, exist_ok=True)
    db = connect(state_dir / DB_NAME)
    db.executescript(SCHEMA)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO outbox (id, receiver, group_key, idempotency_key, payload, firing, resolved, created,"
        " next_attempt, status) VALUES (?, ?, ?, ?, ?, ?, '[]', ?, ?, 'pending')",
        [(i + 1, rc, g, f"key-{i + 1}", p, json.dumps([f"fp-{g}"]), now, now) for i, (rc, g, p) in enumerate(rows)],
    )
    db.execute("COMMIT")
    db.close()


def status_counts(state_dir: Path) -> dict[tuple[str, str], int]:
    with sqlite3.connect(state_dir / DB_NAME) as db:
        return {(r[0], r[1]): r[2] for r in db.execute(
            "SELECT receiver, status, COUNT(*) FROM outbox GROUP BY receiver, status")}  # fmt: skip


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "PAGE_ROWS", PAGE)
    monkeypatch.setattr(outbox, "PAGE_ROWS", PAGE)


async def test_a_long_queue_is_paged_and_delivered_once_in_order(
    sink: Sink, tmp_path: Path, small_pages: None
) -> None:
    n, orphans = 10 * PAGE + 3, 50
    now = time.time()
    payloads = [json.dumps({"n": i}) for i in range(n)]
    rows = [("r1", f"g{i % 7}", p) for i, p in enumerate(payloads)] + [("gone", "g", "{}")] * orphans
    huge = n // 2  # one stored row over the cap, in the middle of the queue
    rows[huge] = ("r1", "g-huge", "x" * (MAX_PAYLOAD_BYTES + 1))
    fill(tmp_path, rows, now)
    clock = ScaledClock(speed=1.0)
    config = notify_config([receiver("r1", "webhook", sink.url)], max_retry_age="30d")
    d = await make_dispatcher(config, tmp_path, clock, start=False)
    try:
        # At start: a page per receiver in memory, the rest counted.
        assert d.outbox.rows_in_memory() == 2 * PAGE
        assert d.outbox.depths() == {"r1": n, "gone": orphans}
        await d.start()
        # The orphans: failed at once, in one statement, never read into memory.
        assert "gone" not in d.outbox.depths()
        await until(lambda: len(sink.requests) >= n - 1 and d.outbox.depths() == {}, "the queue drained")
        assert d.outbox.rows_in_memory() == 0
    finally:
        await d.stop()
    bodies = [r.body.decode() for r in sink.requests]
    assert bodies == [p for i, p in enumerate(payloads) if i != huge]  # once each, in order, the huge one never
    assert status_counts(tmp_path) == {("r1", "delivered"): n - 1, ("r1", "failed"): 1, ("gone", "failed"): orphans}
    with sqlite3.connect(tmp_path / DB_NAME) as db:
        (error,) = db.execute("SELECT last_error FROM outbox WHERE group_key = 'g-huge'").fetchone()
    assert "over the" in error and str(MAX_PAYLOAD_BYTES) in error


async def test_new_rows_queue_behind_the_ones_on_disk(sink: Sink, tmp_path: Path, small_pages: None) -> None:
    now = time.time()
    fill(tmp_path, [("r1", f"old{i}", json.dumps({"old": i})) for i in range(3 * PAGE)], now)
    state = StateStore(tmp_path)
    try:
        box = state.outbox
        new = [box.enqueue("r1", f"new{i}", json.dumps({"new": i}), firing=[f"n{i}"], resolved=[], now=now)
               for i in range(PAGE)]  # fmt: skip
        assert box.rows_in_memory() == PAGE and box.depths() == {"r1": 4 * PAGE}
        # The dedup view knows the newest row of every group, on disk or not.
        entries = box.effective_entries()
        assert entries[("r1", "old0")].firing == frozenset({"fp-old0"})
        assert entries[("r1", "new3")].firing == frozenset({"n3"})
        seen = []
        while (head := box.next_pending("r1")) is not None or box.backlog("r1"):
            if head is None:
                assert await box.refill("r1")
                continue
            seen.append(json.loads(head.payload))
            box.mark_delivered(head, now, now + 60)
        assert seen == [{"old": i} for i in range(3 * PAGE)] + [{"new": i} for i in range(PAGE)]
        assert new[-1].id == max(r.id for r in box.rows())
    finally:
        state.close()


def test_no_notification_over_the_cap_is_stored(tmp_path: Path) -> None:
    state = StateStore(tmp_path)
    try:
        with pytest.raises(PayloadTooLarge):
            state.outbox.enqueue("r1", "g", "é" * (MAX_PAYLOAD_BYTES // 2 + 1), firing=[], resolved=[], now=1.0)
        assert state.outbox.depths() == {} and state.outbox.rows() == []
    finally:
        state.close()


async def test_a_group_too_big_for_one_message_is_cut_to_fit(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=1.0)
    config = notify_config([receiver("r1", "webhook", sink.url)], group_wait="0s", group_by=["alertname"])
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        alerts = [mk_alert(uuid=f"GPU-{i:03d}", gpu=str(i), t=clock.now(), summary="s" * 20_000) for i in range(100)]
        d.update(alerts)
        d.wake()
        [req] = await sink.wait_for(1)
        assert len(req.body) <= MAX_PAYLOAD_BYTES
        assert 0 < len(req.json["alerts"]) < 100
    finally:
        await d.stop()
