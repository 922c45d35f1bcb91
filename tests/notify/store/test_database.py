"""A damaged database is moved aside at start and the daemon goes on with empty state; a bad row is skipped alone."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.notify.silences import Silences
from gpuwatchd.notify.store import DB_NAME, StateStore
from gpuwatchd.notify.store.database import quarantine
from tests.notify.store.damage import MOVED, NOW, SKIPPED, make_good


def exposition(state: StateStore) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(state.collector())
    return generate_latest(reg).decode()


@pytest.mark.parametrize("name", sorted(MOVED))
async def test_a_damaged_file_is_moved_aside_once_and_state_starts_empty(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    damage, reason = MOVED[name]
    damage(tmp_path)
    original = (tmp_path / DB_NAME).read_bytes()
    with caplog.at_level(logging.ERROR, logger="gpuwatchd.notify.store"):
        state = StateStore(tmp_path)
    try:
        assert state.recovered == reason and state.moved_to is not None
        [moved] = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
        assert moved == state.moved_to and moved.read_bytes() == original  # kept, byte for byte, for inspection
        said = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
        assert len(said) == 1 and str(moved) in said[0] and "\n" not in said[0]
        assert f'gpuwatchd_state_db_recovered_total{{reason="{reason}"}} 1.0' in exposition(state)
        # Empty, and working: a new notification is stored.
        assert state.outbox.depths() == {} and state.nflog.entries() == {}
        row = state.outbox.enqueue("r", "g", "{}", firing=["a"], resolved=[], now=NOW)
        assert await state.outbox.stored(row.id)
    finally:
        state.close()
    # The next start finds a sound file: nothing moved again.
    again = StateStore(tmp_path)
    try:
        assert again.recovered is None and again.outbox.depths() == {"r": 1}
        assert len([p for p in tmp_path.iterdir() if ".corrupt-" in p.name]) == 1
    finally:
        again.close()


@pytest.mark.parametrize("name", sorted(SKIPPED))
def test_one_bad_row_is_skipped_counted_and_the_rest_kept(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    damage, table = SKIPPED[name]
    damage(tmp_path)
    with caplog.at_level(logging.WARNING):
        state = StateStore(tmp_path)
        silences = Silences(state.silences)
    try:
        assert state.recovered is None and not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
        assert dict(state.skipped) == {table: 1}
        assert f'gpuwatchd_state_db_rows_skipped_total{{table="{table}"}} 1.0' in exposition(state)
        assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1
        assert state.outbox.depths() == {"r": 40 - (table == "outbox")}
        assert [s.id for s in silences.listing(NOW)] == ["good1"]
        assert state.nflog.get("r", "logged") is not None
    finally:
        state.close()


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda c: c.execute("UPDATE nflog SET firing = 'not json'"),
        lambda c: c.execute("UPDATE nflog SET timestamp = 'yesterday'"),
    ],
)
def test_a_bad_log_row_is_skipped(tmp_path: Path, corrupt: Callable[[sqlite3.Connection], object]) -> None:
    db = make_good(tmp_path, rows=2)
    with sqlite3.connect(db) as c:
        corrupt(c)
    c.close()
    state = StateStore(tmp_path)
    try:
        assert dict(state.skipped) == {"nflog": 1} and state.nflog.entries() == {}
        assert state.outbox.depths() == {"r": 2}
    finally:
        state.close()


def test_quarantine_never_overwrites_an_earlier_one(tmp_path: Path) -> None:
    first = tmp_path / "a.db"
    for text in ("one", "two"):
        first.write_text(text)
        Path(f"{first}-wal").write_text(text + "-wal")
        moved = quarantine(first, now=0.0)
        assert moved.read_text() == text and Path(f"{moved}-wal").read_text() == text + "-wal"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "a.db.corrupt-19700101T000000Z",
        "a.db.corrupt-19700101T000000Z-wal",
        "a.db.corrupt-19700101T000000Z.1",
        "a.db.corrupt-19700101T000000Z.1-wal",
    ]
