"""The probe service inside the real daemon, against the stand-in NVML driver: a GPU lost mid-probe cancels the
probe (a skip, not a failure), and a daemon stopping mid-probe leaves no worker behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from until import until

from gpuwatchd.config.loader import config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim.probes import SimProbes
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state


def _config(tmp_path: Path, libdir: Path) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "nvml": {"library_path": str(libdir), "poll_interval": "100ms", "restart_backoff_max": "500ms"},
        "sysfs": {"root": str(tmp_path / "sysfs")},
        "probes": {"interval": "60s", "idle_for": "0s", "deadline": "600s", "duty_cycle": 1.0},
    }


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
    pids = await until(lambda: set(daemon.probes.own_pids) if daemon.probes else None, "a probe worker")
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
        await until(lambda: led.skipped.get((uuid, "gpu_lost")), "the probe cancelled for the lost GPU")
        await until(lambda: _gone(worker), "the worker killed")
        assert {r for (_, _, r) in led.runs} == {"cancelled"}
        assert not [a for a in daemon.evaluate() if a.name == "GpuProbeFailed"]
    finally:
        await daemon.stop()


async def test_daemon_stopping_mid_probe_leaves_no_worker(tmp_path: Path, standin_libdir: Path,
                                                         write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    daemon, worker = await _hung_probe(tmp_path, standin_libdir, write_sim_state)
    await daemon.stop()
    await until(lambda: _gone(worker), "the worker killed with the daemon's stop")


def _probe_config(tmp_path: Path, libdir: Path, **probes: Any) -> Any:
    cfg = _config(tmp_path, libdir)
    cfg["probes"] = {"interval": "60s", "idle_for": "0s", "deadline": "600s", "duty_cycle": 1.0, **probes}
    return config_from_dict(cfg)


async def test_a_hung_gpu_does_not_hold_the_other_gpus_probes(tmp_path: Path, standin_libdir: Path,
                                                             write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    """GPU A's worker hangs (deadline 600 s); after hang_after (2 s) it stops holding the host's one slot, and
    GPU B is probed while A's worker still runs. Before, B waited for A's whole deadline."""
    state = make_state(2)
    hung, other = sorted(d["uuid"] for d in state["devices"])  # equally due: the scheduler takes uuid order
    next(d for d in state["devices"] if d["uuid"] == hung)["_probe"] = {"hang": True}
    path = write_sim_state(state)
    daemon = Daemon(_probe_config(tmp_path, standin_libdir, hang_after="2s"), worker_env={STATE_ENV: str(path)},
                    probe_sim=SimProbes(path))
    await daemon.start()
    try:
        assert daemon.probes is not None
        svc, led = daemon.probes, daemon.store.probes
        await until(lambda: hung in svc.running and svc.own_pids, "the hung GPU's worker")
        await until(lambda: (other, "gemm") in led.last, "the other GPU's probe verdict")
        assert led.last[(other, "gemm")].result == "pass"
        assert hung in svc.running and not any(u == hung for (u, _) in led.last)  # still hung, no verdict yet
        assert svc.scheduler.gpus[hung].last_start is not None
        assert svc.scheduler.gpus[hung].last_start <= (svc.scheduler.gpus[other].last_start or 0.0)
        assert daemon.status()["probes"]["running_gpus"] == [hung]
    finally:
        await daemon.stop()


async def test_no_probe_until_idle_for_after_a_job_ends(tmp_path: Path, standin_libdir: Path,
                                                        write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    """A job holding the GPU at 0% utilization (a checkpoint write) ends: the probe waits idle_for after the last
    poll that listed it, though the latest snapshot is idle right away."""
    state = make_state(1)
    uuid = state["devices"][0]["uuid"]
    state["devices"][0]["processes"] = {"compute": [{"pid": 4242, "used_memory": 1 << 30}], "graphics": []}
    path = write_sim_state(state)
    daemon = Daemon(_probe_config(tmp_path, standin_libdir, idle_for="3s"), worker_env={STATE_ENV: str(path)},
                    probe_sim=SimProbes(path))
    await daemon.start()
    try:
        assert daemon.probes is not None
        led, sched = daemon.store.probes, daemon.probes.scheduler
        await until(lambda: led.skipped.get((uuid, "busy_process")), "a skip while the job runs")
        state["devices"][0]["processes"] = {"compute": [], "graphics": []}
        write_sim_state(state)
        await until(lambda: sched.gpus.get(uuid) and sched.gpus[uuid].last_start is not None, "the first run")
        last_job_poll = max(b.end for b in daemon.store.activity.since(uuid, 0.0) if 4242 in b.pids)
        start = sched.gpus[uuid].last_start
        assert start is not None and start >= last_job_poll + 3.0
    finally:
        await daemon.stop()
