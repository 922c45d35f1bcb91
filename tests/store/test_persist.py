"""Rule history across a restart: round trip, retention and future points dropped, gone GPUs/pids pruned, and
every kind of broken or hostile file refused with HistoryError."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from gpuwatchd.store import Store, persist
from tests.rules.conftest import GIB, T0, UUID, gpu, proc, snap, with_processes


def filled(minutes: int = 20) -> Store:
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    for i in range(minutes * 12):
        t = T0 + 5 * i
        store.apply(snap(t, with_processes(gpu(), [proc(4242, 4 * GIB + i * 1024**2, rss=GIB)])))
    return store


def test_round_trip_keeps_the_leak_rules_series() -> None:
    old = filled()
    now = T0 + 20 * 60
    new = Store(retention_seconds=3600.0, step_seconds=5.0)
    assert persist.restore(new, persist.decode(persist.encode(old, now)), now) == 2
    a, b = old.process_history(UUID, 4242), new.process_history(UUID, 4242)
    assert [(p.t, p.used_memory_bytes, p.host_rss_bytes) for p in a] == [
        (p.t, p.used_memory_bytes, p.host_rss_bytes) for p in b]
    assert [p.memory_used_bytes for p in old.gpu_history(UUID)] == [p.memory_used_bytes for p in new.gpu_history(UUID)]


def test_streamed_file_is_the_whole_document_for_several_gpus_and_processes() -> None:
    """The file is written a ring at a time (bounded memory per save): with several GPUs and processes it is still
    one JSON document with every ring, in the layout ``decode`` reads."""
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    other = UUID[:-1] + "1"
    for i in range(30):
        t = T0 + 5 * i
        store.apply(snap(t, with_processes(gpu(), [proc(1, GIB + i), proc(2, GIB)]),
                         with_processes(gpu(other, 1), [proc(3, 2 * GIB + i)])))
    data = persist.encode(store, T0 + 150)
    doc = json.loads(zlib.decompress(data))
    assert sorted(doc["gpus"]) == sorted([UUID, other]) and doc["saved_at"] == T0 + 150
    assert sorted((u, pid) for u, pid, _ in doc["procs"]) == [(UUID, 1), (UUID, 2), (other, 3)]
    assert all(len(points) == 30 for *_, points in doc["procs"])
    restored = Store(retention_seconds=3600.0, step_seconds=5.0)
    assert persist.restore(restored, persist.decode(data), T0 + 150) == 5
    assert [p.used_memory_bytes for p in restored.process_history(other, 3)] == [2 * GIB + i for i in range(30)]


def test_restore_drops_points_outside_retention_and_from_the_future() -> None:
    old = filled(20)
    hist = persist.decode(persist.encode(old, T0 + 1200))
    new = Store(retention_seconds=600.0, step_seconds=5.0)
    persist.restore(new, hist, T0 + 900)  # restarted "before" the last points: those are from the future
    ts = [p.t for p in new.process_history(UUID, 4242)]
    assert ts and min(ts) >= T0 + 300 and max(ts) <= T0 + 900


def test_prune_drops_gpus_and_pids_that_no_longer_exist() -> None:
    old = filled(2)
    new = Store()
    persist.restore(new, persist.decode(persist.encode(old, T0 + 120)), T0 + 120)
    first = snap(T0 + 125, with_processes(gpu(), [proc(5000, GIB)]))  # 4242 is gone, a new job runs
    assert persist.prune(new, first) == 1
    assert new.process_history(UUID, 4242) == () and new.gpu_history(UUID)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage",
        zlib.compress(b"[1, 2"),
        zlib.compress(json.dumps({"v": 99}).encode()),
        zlib.compress(json.dumps({"v": 1, "saved_at": "x", "gpus": {}, "procs": []}).encode()),
        zlib.compress(json.dumps({"v": 1, "saved_at": 1.0, "gpus": {"g": [[1.0, -5, 1, 1]]}, "procs": []}).encode()),
        zlib.compress(json.dumps({"v": 1, "saved_at": 1.0, "gpus": {}, "procs": [["g", True, []]]}).encode()),
        zlib.compress(b'{"v":1,"saved_at":1e999,"gpus":{},"procs":[]}'),
        zlib.compress(b"[" * 100000),
        zlib.compress(json.dumps({"v": 1, "saved_at": 1.0, "gpus": {}, "procs": []}).encode())[:-3],
    ],
    ids=["empty", "garbage", "bad-json", "version", "saved-at", "negative", "bool-pid", "inf", "deep", "truncated"],
)
def test_broken_or_hostile_files_are_refused(data: bytes) -> None:
    with pytest.raises(persist.HistoryError):
        persist.decode(data)


def test_zip_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(persist, "MAX_BYTES", 1024)
    with pytest.raises(persist.HistoryError, match="more than"):
        persist.decode(zlib.compress(b" " * 10_000))


def test_write_atomic_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / persist.FILE_NAME
    persist.write_atomic(path, b"one")
    persist.write_atomic(path, b"two")
    assert path.read_bytes() == b"two" and not (tmp_path / (persist.FILE_NAME + ".tmp")).exists()
