"""Rule history across a real daemon restart (in-process, stand-in driver): saved at stop, restored at start with
the gone pid dropped; a corrupt file starts empty with one log line and the load-error metric."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatchd.config.loader import load_config
from gpuwatchd.daemon import Daemon
from gpuwatchd.rules import leak
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state
from gpuwatchd.store import Store, history_file, persist
from gpuwatchd.store.history_file import HistoryFile
from gpuwatchd.store.journal import Journal
from tests.daemon.test_daemon import scrape, sim_config, value, wait_for
from tests.rules.conftest import T0, UUID, gpu, proc, snap, with_processes

GIB = 1024**3


def daemon_for(tmp_path: Path, libdir: Path, state_path: Path) -> Daemon:
    cfg_file = tmp_path / "gpuwatchd.yml"
    cfg_file.write_text(yaml.safe_dump(sim_config(tmp_path, libdir)))
    return Daemon(load_config(cfg_file, required=True), config_path=cfg_file, worker_env={STATE_ENV: str(state_path)})


def with_procs(pids: list[int]) -> dict[str, Any]:
    state = make_state(1)
    state["devices"][0]["processes"] = {"compute": [{"pid": p, "used_memory": 2 * GIB, "name": "python"}
                                                    for p in pids]}
    return state


async def test_history_survives_a_restart_and_gone_pids_are_dropped(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    path = write_sim_state(with_procs([4242, 4343]))
    first = daemon_for(tmp_path, standin_libdir, path)
    await first.start()
    file = tmp_path / "state" / persist.FILE_NAME
    try:
        uuid = await wait_for(lambda: _uuid_with_history(first, 4343, 3), "history of pid 4343")
        assert first.history is not None
        await first.history.save()  # the run's first save: the file written afresh
        written = file.read_bytes()
        newest = first.store.process_history(uuid, 4242)[-1].t

        async def polled_again() -> bool:
            return first.store.process_history(uuid, 4242)[-1].t > newest
        await wait_for(polled_again, "a poll after the save")
    finally:
        await first.stop()  # saves again: appended
    saved = {p.t for p in first.store.process_history(uuid, 4242)}
    at_stop = file.read_bytes()
    assert written.startswith(persist.MAGIC) and at_stop.startswith(written) and len(at_stop) > len(written)

    write_sim_state(with_procs([4242]))  # 4343 ended while the daemon was down
    second = daemon_for(tmp_path, standin_libdir, path)
    await second.start()
    try:
        # primed at the restore (rules.leak.prime), before any evaluation: the first one reads only what came since
        # (the first daemon's evaluations left keys alike: the anchors must be points of this store's rings)
        for key in ((uuid, 4242), (uuid, 4343)):
            anchor = leak._FLAT._memo[key][0]
            assert second.store.process_history_after(*key, anchor)[1]

        async def restored() -> bool:
            return second.store.latest is not None and second.history is not None and second.history.restored > 0
        await wait_for(restored, "a snapshot after the restore")
        kept = {p.t for p in second.store.process_history(uuid, 4242)}
        # The history from before the restart is there (its newest point may be replaced by the first new one:
        # the ring keeps one point per history.step).
        assert len(saved) >= 3 and set(sorted(saved)[:-1]) <= kept
        assert second.store.process_history(uuid, 4343) == ()  # a gone pid's history is dropped
        samples = await scrape(second.url)
        assert value(samples, "gpuwatchd_rule_history_restored_series") == second.history.restored
        assert value(samples, "gpuwatchd_rule_history_load_errors_total") == 0
    finally:
        await second.stop()


async def _uuid_with_history(d: Daemon, pid: int, points: int) -> str | None:
    for uuid, p in d.store.process_keys():
        if p == pid and len(d.store.process_history(uuid, p)) >= points:
            return uuid
    return None


@pytest.mark.parametrize("content", [b"not a history file", b"\x78\x9c" + b"\x00" * 64])
async def test_corrupt_history_starts_empty_with_a_log_line_and_a_metric(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path],
    caplog: pytest.LogCaptureFixture, content: bytes,
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / persist.FILE_NAME).write_bytes(content)
    path = write_sim_state(with_procs([4242]))
    d = daemon_for(tmp_path, standin_libdir, path)
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.store.history_file"):
        await d.start()
    try:
        lines = [r for r in caplog.records if "rule history" in r.getMessage()]
        assert len(lines) == 1 and "starting with empty history" in lines[0].getMessage()
        samples = await scrape(d.url)
        assert value(samples, "gpuwatchd_rule_history_load_errors_total") == 1
        assert value(samples, "gpuwatchd_rule_history_restored_series") == 0
        # it is replaced by a good file at the next save
        await d.history.save()  # type: ignore[union-attr]
        persist.decode((tmp_path / "state" / persist.FILE_NAME).read_bytes())
    finally:
        await d.stop()


async def test_a_failed_save_is_counted_and_retried(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    path = write_sim_state(with_procs([4242]))
    d = daemon_for(tmp_path, standin_libdir, path)
    await d.start()
    try:
        assert d.history is not None
        target = d.history.path
        target.mkdir()  # a directory where the file goes: the rename fails like a full or broken disk would
        await d.history.save()
        samples = await scrape(d.url)
        assert value(samples, "gpuwatchd_rule_history_save_errors_total") == 1
        target.rmdir()
        await d.history.save()
        assert target.is_file()
    finally:
        await asyncio.shield(d.stop())


# -- the incremental file, without a daemon (a manual clock, the real store) --------------------------------------

RETENTION = 600.0


def polled(store: Store, clock: ManualClock, seconds: int, pids: list[int]) -> None:
    for _ in range(seconds):
        clock.t += 1.0
        store.apply(snap(clock.t, with_processes(gpu(), [proc(p, GIB + int(clock.t) % 600 * 1024**2, rss=GIB)
                                                          for p in pids])))


def restarted(state_dir: Path, clock: ManualClock) -> tuple[Store, HistoryFile]:
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(state_dir, store, clock)
    hf.load()
    return store, hf


def held(store: Store) -> dict[tuple[str, int], list[tuple[float, int | None, int | None]]]:
    return {k: [(p.t, p.used_memory_bytes, p.host_rss_bytes) for p in store.process_history(*k)]
            for k in store.process_keys()}


async def test_saves_append_cut_what_aged_out_and_a_restart_loads_what_the_store_held(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    pids = [1, 2, 3]
    before = b""
    appended = cut = 0
    for minute in range(40):
        if minute % 7 == 6:
            pids = [*pids[1:], 100 + minute]  # a job ends, another starts
        polled(store, clock, 60, pids)
        await hf.save()
        data = hf.path.read_bytes()
        assert data.startswith(persist.MAGIC) and hf.saved_bytes == len(data) and hf.save_errors == 0
        if before and data.startswith(before):
            appended += 1
        elif before:
            cut += 1
            assert len(data) < len(before)
        before = data
        if minute >= 10:  # the retention turned over: the file holds it and at most half as much again
            fresh = persist.encode_full(Journal().collect(store, full=True), clock.t, 50.0)
            assert len(data) <= 1.5 * (len(persist.MAGIC) + sum(b.size for b in fresh)) + 4096
    assert appended > 25 and cut >= 3

    again, hf2 = restarted(tmp_path, clock)
    live = {k for k, pts in held(store).items() if pts[-1][0] == clock.t}
    assert live and {k: held(again)[k] for k in live} == {k: held(store)[k] for k in live}
    assert [p.t for p in again.gpu_history(UUID)] == [p.t for p in store.gpu_history(UUID)]
    assert hf2.restored == len(held(again)) + 1 and hf2.load_errors == 0


async def test_a_crash_while_appending_loses_that_save_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    for _ in range(3):
        polled(store, clock, 60, [1, 2])
        await hf.save()
    saved = hf.path.read_bytes()
    then = clock.t
    polled(store, clock, 60, [1, 2])
    await hf.save()
    whole = hf.path.read_bytes()
    assert whole.startswith(saved) and len(whole) > len(saved) + 16
    hf.path.write_bytes(whole[:len(saved) + (len(whole) - len(saved)) // 2])  # the power went mid-append

    clock.t = then
    reference = Store(retention_seconds=RETENTION, step_seconds=5.0)
    persist.restore(reference, persist.decode(saved), then)
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.store.history_file"):
        again, hf2 = restarted(tmp_path, clock)
    assert held(again) == held(reference) and hf2.load_errors == 0
    (line,) = [r.getMessage() for r in caplog.records if "rule history" in r.getMessage()]
    assert "dropped" in line and "starting with empty history" not in line
    await hf2.save()  # the first save of a run writes the file afresh: the torn end is gone
    assert persist.decode(hf2.path.read_bytes()).torn is None


async def test_a_failed_append_is_counted_and_the_next_save_writes_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    polled(store, clock, 60, [1])
    await hf.save()
    real = history_file._append

    def disk_full(path: Path, block: persist.Block, size: int) -> None:
        with path.open("ab") as f:
            f.write((block.header + block.payload)[:10])  # part of it reached the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(history_file, "_append", disk_full)
    polled(store, clock, 60, [1])
    await hf.save()
    assert hf.save_errors == 1 and persist.decode(hf.path.read_bytes()).torn is not None
    monkeypatch.setattr(history_file, "_append", real)
    polled(store, clock, 60, [1])
    await hf.save()
    data = hf.path.read_bytes()
    assert hf.save_errors == 1 and persist.decode(data).torn is None
    again, _ = restarted(tmp_path, clock)
    assert held(again) == held(store)


async def test_a_file_changed_behind_its_back_is_written_afresh(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    polled(store, clock, 60, [1])
    await hf.save()
    hf.path.write_bytes(b"someone else's")
    polled(store, clock, 60, [1])
    await hf.save()
    assert hf.save_errors == 0
    again, _ = restarted(tmp_path, clock)
    assert held(again) == held(store)


async def test_a_version_1_file_is_restored_and_rewritten_as_version_2(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    old = Store(retention_seconds=RETENTION, step_seconds=5.0)
    polled(old, clock, 300, [1, 2])
    (tmp_path / persist.FILE_NAME).write_bytes(persist.encode(old, clock.t))  # written before the upgrade
    store, hf = restarted(tmp_path, clock)
    assert hf.restored == 3 and held(store) == held(old)
    await hf.save()
    data = hf.path.read_bytes()
    assert data.startswith(persist.MAGIC)
    again, _ = restarted(tmp_path, clock)
    assert held(again) == held(old)


async def test_a_file_near_the_load_limit_is_cut_at_every_block_that_aged_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is read whole at start, at most ``MAX_FILE_BYTES``: over half of that, aged-out blocks are cut off
    at every save, not once they are a third of the file."""
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)

    def aged_out() -> int:
        assert hf._extents is not None
        return sum(e.expires < clock.t - RETENTION for e in hf._extents[:-1])

    loose = []
    for _ in range(25):
        polled(store, clock, 60, [1, 2, 3])
        await hf.save()
        loose.append(aged_out())
    assert max(loose[15:]) >= 2  # below the limit, aged-out blocks wait for a third of the file
    monkeypatch.setattr(history_file, "MAX_FILE_BYTES", hf.saved_bytes)
    for _ in range(10):
        polled(store, clock, 60, [1, 2, 3])
        await hf.save()
        assert aged_out() == 0
    again, _ = restarted(tmp_path, clock)
    assert held(again) == held(store)


def gpu_held(store: Store) -> dict[str, list[tuple[float, int | None]]]:
    return {u: [(p.t, p.memory_used_bytes) for p in store.gpu_history(u)] for u in store.gpu_keys()}


async def test_a_restart_goes_on_appending_to_the_file_it_loaded(tmp_path: Path) -> None:
    """The file a restart loads whole is adopted (history_file._adopt): the first save appends what came since
    (no full encode, no rewrite), lists the processes pruned at the first snapshot as gone, and a later restart
    loads exactly what the store held; saves after it still append and cut as before."""
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    for minute in range(12):
        polled(store, clock, 60, [1, 2, 3] if minute < 8 else [1, 2, 3, 4])
        await hf.save()
    await hf.save()
    on_disk = hf.path.read_bytes()

    clock.t += 20.0  # down for 20 s
    again, hf2 = restarted(tmp_path, clock)
    assert hf2._extents is not None and hf2.saved_bytes == len(on_disk)  # adopted
    first = snap(clock.t + 1.0, with_processes(gpu(), [proc(p, GIB, rss=GIB) for p in (1, 2, 4)]))
    hf2.on_snapshot(first)  # pid 3 is gone: pruned
    again.apply(first)
    clock.t += 1.0
    polled(again, clock, 90, [1, 2, 4])
    await hf2.save()
    after = hf2.path.read_bytes()
    assert after.startswith(on_disk) and len(after) > len(on_disk)  # appended, not written afresh
    assert hf2.saved_bytes == len(after)
    for _ in range(15):  # the retention turns over: the adopted blocks age out and are cut like any
        polled(again, clock, 60, [1, 2, 4])
        await hf2.save()
    assert not hf2.path.read_bytes().startswith(on_disk[:len(persist.MAGIC) + 64])

    third, hf3 = restarted(tmp_path, clock)
    assert hf3.load_errors == 0
    assert held(third) == held(again)  # pid 3's ring is gone from the file too
    assert (UUID, 3) not in held(third)
    assert gpu_held(third) == gpu_held(again)


@pytest.mark.parametrize("why", ["torn", "past_now", "version_1"])
async def test_a_file_that_cannot_be_continued_is_written_afresh_by_the_first_save(
        tmp_path: Path, why: str) -> None:
    """Not adopted: a file whose last block was cut short, one with points past the restarted daemon's clock
    (restoring drops them, so the file's rings no longer end where the store's do), a version 1 file. The first
    save writes the file afresh, and a restart loads what the store held."""
    clock = ManualClock(T0)
    store = Store(retention_seconds=RETENTION, step_seconds=5.0)
    hf = HistoryFile(tmp_path, store, clock)
    for _ in range(4):
        polled(store, clock, 60, [1, 2])
        await hf.save()
    if why == "torn":
        polled(store, clock, 60, [1, 2])
        before = hf.path.read_bytes()
        await hf.save()
        whole = hf.path.read_bytes()
        hf.path.write_bytes(whole[:len(before) + (len(whole) - len(before)) // 2])
    elif why == "past_now":
        clock.t -= 30.0  # the clock went back 30 s across the restart: the newest points are in its future
    else:
        hf.path.write_bytes(persist.encode(store, clock.t))  # written before the upgrade
    on_disk = hf.path.read_bytes()
    again, hf2 = restarted(tmp_path, clock)
    assert hf2.restored > 0 and hf2._extents is None  # not adopted
    clock.t += 40.0
    polled(again, clock, 30, [1, 2])
    await hf2.save()
    assert not hf2.path.read_bytes().startswith(on_disk)  # written afresh
    third, _ = restarted(tmp_path, clock)
    assert held(third) == held(again)
