"""The probe service inside the real daemon, against the stand-in NVML driver: a GPU lost mid-probe cancels the
probe (a skip, not a failure), and a daemon stopping mid-probe leaves no worker behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpuwatchd.config.loader import config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.probes.sim import SimProbes
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state

WAIT_S = 120.0  # liveness bound on a loaded machine; each wait returns as soon as its condition holds


def _config(tmp_path: Path, libdir: Path) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "nvml": {"library_path": str(libdir), "poll_interval": "100ms", "restart_backoff_max": "500ms"},
        "sysfs": {"root": str(tmp_path / "sysfs")},
        "probes": {"interval": "60s", "idle_for": "0s", "deadline": "600s", "duty_cycle": 1.0},
    }


async def _until(cond: Callable[[], Any], what: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_S
    while not (result := cond()):
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return result


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _hung_probe(tmp_path: Path, libdir: Path, write: Callable[[dict[str, Any]], Path]) -> tuple[Daemon, int]:
    state = make_state(1)
    state["devices"][0]["_probe"] = {"hang": True}
    path = write(state)
    daemon = Daemon(config_from_dict(_config(tmp_path, libdir)), worker_env={STATE_ENV: str(path)},
                    probe_sim=SimProbes(path))
    await daemon.start()
    assert daemon.probes is not None
    pids = await _until(lambda: set(daemon.probes.own_pids) if daemon.probes else None, "a probe worker")
    return daemon, next(iter(pids))


async def test_gpu_lost_mid_probe_cancels_it(tmp_path: Path, standin_libdir: Path,
                                            write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    daemon, worker = await _hung_probe(tmp_path, standin_libdir, write_sim_state)
    try:
        state = make_state(1)
        state["devices"][0]["lost"] = True
        write_sim_state(state)
        uuid = state["devices"][0]["uuid"]
        led = daemon.store.probes
        await _until(lambda: led.skipped.get((uuid, "gpu_lost")), "the probe cancelled for the lost GPU")
        await _until(lambda: _gone(worker), "the worker killed")
        assert {r for (_, _, r) in led.runs} == {"cancelled"}
        assert not [a for a in daemon.evaluate() if a.name == "GpuProbeFailed"]
    finally:
        await daemon.stop()


async def test_daemon_stopping_mid_probe_leaves_no_worker(tmp_path: Path, standin_libdir: Path,
                                                         write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    daemon, worker = await _hung_probe(tmp_path, standin_libdir, write_sim_state)
    await daemon.stop()
    await _until(lambda: _gone(worker), "the worker killed with the daemon's stop")
