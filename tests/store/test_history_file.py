"""Rule history across a real daemon restart (in-process, stand-in driver): saved at stop, restored at start with
the gone pid dropped; a corrupt file starts empty with one log line and the load-error metric."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatchd.config.loader import load_config
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state
from gpuwatchd.store import persist
from tests.daemon.test_daemon import scrape, sim_config, value, wait_for

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
    try:
        uuid = await wait_for(lambda: _uuid_with_history(first, 4343, 3), "history of pid 4343")
    finally:
        await first.stop()
    saved = {p.t for p in first.store.process_history(uuid, 4242)}
    assert (tmp_path / "state" / persist.FILE_NAME).exists()

    write_sim_state(with_procs([4242]))  # 4343 ended while the daemon was down
    second = daemon_for(tmp_path, standin_libdir, path)
    await second.start()
    try:
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
