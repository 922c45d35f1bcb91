"""Rule history across a restart: round trip, retention and future points dropped, gone GPUs/pids pruned, and
every kind of broken or hostile file refused with HistoryError."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatchd.store import Store, persist
from gpuwatchd.store.journal import Journal
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


# -- version 2: a log of blocks ----------------------------------------------------------------------------------

OTHER = UUID[:-1] + "1"


def view(store: Store) -> tuple[dict[str, list[tuple[object, ...]]], dict[tuple[str, int], list[tuple[object, ...]]]]:
    """What the file carries of each ring."""
    return (
        {u: [(p.t, p.memory_used_bytes, p.memory_total_bytes, p.processes_memory_bytes) for p in store.gpu_history(u)]
         for u in store.gpu_keys()},
        {k: [(p.t, p.used_memory_bytes, p.host_rss_bytes) for p in store.process_history(*k)]
         for k in store.process_keys()},
    )


def loaded(data: bytes, now: float, retention: float = 600.0) -> Store:
    store = Store(retention_seconds=retention, step_seconds=5.0)
    persist.restore(store, persist.decode(data), now)
    return store


def log_file(blocks: list[persist.Block]) -> bytes:
    return persist.MAGIC + b"".join(b.header + b.payload for b in blocks)


def poll(store: Store, t: float, pids: dict[str, list[int]]) -> None:
    store.apply(snap(t, *(with_processes(gpu(u, i), [proc(p, GIB + (int(t) * p) % 997 * 1024**2, rss=GIB + int(t))
                                                     for p in ps])
                          for i, (u, ps) in enumerate(pids.items()))))


def advancing(minutes: int, cut: bool) -> Iterator[tuple[Store, float, list[persist.Block]]]:
    """A store polled every second for ``minutes`` (600 s retention: points drop off after ten), pids ending and
    starting, a GPU gone for a while, saved every minute as the daemon does (the first save whole, cut into time
    slices); with ``cut``, every block whose points all aged out is cut off at once."""
    store = Store(retention_seconds=600.0, step_seconds=5.0)
    journal = Journal()
    blocks: list[persist.Block] = []
    pids = {UUID: [10, 11, 12], OTHER: [20]}
    nxt = 100
    for s in range(minutes * 60):
        t = T0 + s
        if s % 97 == 0:  # a job ends, another starts
            pids[UUID] = [*pids[UUID][1:], nxt]
            nxt += 1
        present = {u: ps for u, ps in pids.items() if not (u == OTHER and 400 <= s < 1200)}
        poll(store, t, present)
        if s % 60 == 59:
            delta = journal.collect(store, full=not blocks)
            if delta.full:
                blocks = persist.encode_full(delta, t, 50.0)
            elif not delta.empty:
                blocks.append(persist.encode_delta(delta, t))
            journal.commit(delta)
            if cut:
                while len(blocks) > 1 and blocks[0].expires < t - 600.0:
                    blocks.pop(0)
            yield store, t, blocks


@pytest.mark.parametrize("cut", [False, True], ids=["kept", "cut"])
def test_many_saves_load_exactly_what_the_store_held(cut: bool) -> None:
    for store, now, blocks in advancing(30, cut):
        data = log_file(blocks)
        hist = persist.decode(data)
        assert hist.torn is None and hist.saved_at == now
        # the same as a whole (version 1) file of the store at that time, ring for ring
        assert view(loaded(data, now)) == view(loaded(persist.encode(store, now), now))
        # and, for the rings still polled (a ring no longer polled keeps points the restart's retention drops),
        # what the store holds
        gpus, procs = view(store)
        again = view(loaded(data, now))
        polled = {k for k, pts in procs.items() if pts[-1][0] == now}
        assert {k: again[1][k] for k in polled} == {k: procs[k] for k in polled}
        assert again[0][UUID] == gpus[UUID]
    assert len(blocks) > 10


def test_points_older_than_the_retention_do_not_grow_the_file() -> None:
    """With the blocks that aged out cut off, the file stays about the size of one written afresh (the retention's
    points); without, it grows with every save."""
    kept = [len(log_file(blocks)) for _, _, blocks in advancing(40, False)]
    for i, (store, now, blocks) in enumerate(advancing(40, True)):
        fresh = len(log_file(persist.encode_full(Journal().collect(store, full=True), now, 50.0)))
        if i >= 10:  # the retention turned over
            assert len(log_file(blocks)) < 1.5 * fresh
    assert len(log_file(blocks)) < kept[-1] / 2


def test_a_torn_or_damaged_last_block_is_dropped_and_the_rest_loads() -> None:
    *_, (_, now, blocks) = advancing(4, False)
    good = log_file(blocks[:-1])
    whole = log_file(blocks)
    expected = view(loaded(good, now))
    assert expected != view(loaded(whole, now))
    for end in range(len(good) + 1, len(whole), 7):  # a crash anywhere while the last block was appended
        hist = persist.decode(whole[:end])
        assert hist.torn is not None
        assert view(loaded(whole[:end], now)) == expected
    damaged = bytearray(whole)
    damaged[len(good) + 20] ^= 0xFF
    assert persist.decode(bytes(damaged)).torn is not None and view(loaded(bytes(damaged), now)) == expected
    junk = whole + b"\x00\x00\x00\x09" + b"\x12\x34\x56\x78" + b"rubbish!!"
    assert persist.decode(junk).torn is not None and view(loaded(junk, now)) == view(loaded(whole, now))


def test_a_file_whose_first_block_is_cut_short_is_refused() -> None:
    *_, (_, _, blocks) = advancing(2, False)
    whole = log_file(blocks)
    first = len(persist.MAGIC) + blocks[0].size
    for end in (len(persist.MAGIC), len(persist.MAGIC) + 3, first - 1):
        with pytest.raises(persist.HistoryError):
            persist.decode(whole[:end])


def test_a_version_1_file_still_loads() -> None:
    """A file written by the version before the incremental save (the layout pinned here by hand)."""
    doc = {"v": 1, "saved_at": T0 + 60,
           "gpus": {UUID: [[T0, GIB, 24 * GIB, GIB // 2], [T0 + 5, 2 * GIB, 24 * GIB, GIB]]},
           "procs": [[UUID, 4242, [[T0, GIB // 2, GIB], [T0 + 5, GIB, None]]]]}
    store = loaded(zlib.compress(json.dumps(doc).encode()), T0 + 60)
    assert view(store) == ({UUID: [(T0, GIB, 24 * GIB, GIB // 2), (T0 + 5, 2 * GIB, 24 * GIB, GIB)]},
                           {(UUID, 4242): [(T0, GIB // 2, GIB), (T0 + 5, GIB, None)]})


def frame(doc: object, *, raw: bytes | None = None) -> bytes:
    payload = zlib.compress(json.dumps(doc).encode()) if raw is None else raw
    return persist.FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def block(**kw: object) -> dict[str, object]:
    return {"saved_at": T0, "gone_gpus": [], "gone_procs": [], "gpus": [], "procs": [], **kw}


@pytest.mark.parametrize(
    "data",
    [
        persist.MAGIC,
        persist.MAGIC + frame([1, 2]),
        persist.MAGIC + frame(block(saved_at="x")),
        persist.MAGIC + frame(block(procs=[[UUID, 1, -1, []]])),
        persist.MAGIC + frame(block(procs=[[UUID, True, None, []]])),
        persist.MAGIC + frame(block(procs=[[UUID, 1, None]])),
        persist.MAGIC + frame(block(procs=[[UUID, 1, None, [[T0, 1, 2, 3]]]])),
        persist.MAGIC + frame(block(gpus=[[7, None, []]])),
        persist.MAGIC + frame(block(gone_procs=[[UUID]])),
        persist.MAGIC + frame(block(gone_gpus="all")),
        persist.MAGIC + frame(block()) + frame(block(procs=[[UUID, 1, 0, [[T0, -5, 1]]]])),
        persist.MAGIC + frame(None, raw=b"not zlib, but its CRC is right"),
        persist.MAGIC + frame(None, raw=zlib.compress(json.dumps(block()).encode()) + b"more"),
        persist.MAGIC + frame(None, raw=zlib.compress(b'{"saved_at":1e999}')),
        persist.MAGIC + frame(None, raw=zlib.compress(b"[" * 100000)),
    ],
    ids=["no-block", "not-a-mapping", "saved-at", "negative-drop", "bool-pid", "short-entry", "point-fields",
         "uuid-not-str", "gone-short", "gone-not-list", "bad-later-block", "not-zlib", "after-the-stream", "inf",
         "deep"],
)
def test_broken_or_hostile_version_2_files_are_refused(data: bytes) -> None:
    with pytest.raises(persist.HistoryError):
        persist.decode(data)


def test_version_2_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    pts = [[T0 + i, GIB, GIB] for i in range(10)]
    many = persist.MAGIC + b"".join(frame(block(procs=[[UUID, pid, None, pts]])) for pid in range(4))
    assert len(persist.decode(many).procs) == 4
    monkeypatch.setattr(persist, "MAX_SERIES", 3)
    with pytest.raises(persist.HistoryError, match="series"):
        persist.decode(many)
    monkeypatch.undo()
    monkeypatch.setattr(persist, "MAX_BLOCKS", 3)
    with pytest.raises(persist.HistoryError, match="blocks"):
        persist.decode(many)
    monkeypatch.undo()
    growing = persist.MAGIC + b"".join(frame(block(procs=[[UUID, 1, 0, pts]])) for _ in range(4))
    assert len(persist.decode(growing).procs[(UUID, 1)]) == 40
    monkeypatch.setattr(persist, "MAX_POINTS", 35)
    with pytest.raises(persist.HistoryError, match="points"):
        persist.decode(growing)
    monkeypatch.undo()
    monkeypatch.setattr(persist, "MAX_BYTES", 3 * len(json.dumps(block(procs=[[UUID, 1, 0, pts]]))))
    with pytest.raises(persist.HistoryError, match="more than"):  # a zip bomb spread over blocks
        persist.decode(growing)


def test_zeros_at_the_end_are_a_torn_save() -> None:
    """A crash can leave the file longer but the appended data unwritten (zeros): a header of zeros says an empty
    block with the CRC of nothing, which no save writes."""
    *_, (_, now, blocks) = advancing(2, False)
    whole = log_file(blocks)
    for zeros in (3, 8, 200):
        hist = persist.decode(whole + b"\0" * zeros)
        assert hist.torn is not None
        assert view(loaded(whole + b"\0" * zeros, now)) == view(loaded(whole, now))
