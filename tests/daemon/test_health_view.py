"""The health state inside the real daemon against the stand-in NVML driver: healthy GPUs, an Xid 48 making one
GPU unhealthy (reason and action in /api/v1/status and /metrics), recovery when the Xid's alert resolves; and the
probe availability metrics exported from the start, with or without GPUs and with the driver down."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from mig_states import a100
from until import until

from gpuwatchd.cli.status import render_status
from gpuwatchd.config.loader import config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.probes.service import torch_cuda_build
from gpuwatchd.runtime.status_client import fetch_status
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state


def _config(tmp_path: Path, libdir: Path, **probes: Any) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "nvml": {"library_path": str(libdir), "poll_interval": "100ms", "restart_backoff_max": "500ms"},
        "sysfs": {"root": str(tmp_path / "sysfs")},
        "rules": {"xid": {"resolve_after": "4s"}, "xid_repeat": {"burst_gap": "1s"}},
        "probes": {"enabled": False, **probes},
    }


def _health(daemon: Daemon, uuid: str) -> dict[str, Any]:
    return next(g["health"] for g in daemon.status()["gpus"] if g["uuid"] == uuid)


async def _get(url: str) -> tuple[str, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            metrics = await r.text()
        async with s.get(url + "/api/v1/status") as r:
            return metrics, await r.json()


async def test_xid_makes_a_gpu_unhealthy_then_it_recovers(tmp_path: Path, standin_libdir: Path,
                                                         write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    state = make_state(2)
    path = write_sim_state(state)
    daemon = Daemon(config_from_dict(_config(tmp_path, standin_libdir)), worker_env={STATE_ENV: str(path)})
    await daemon.start()
    try:
        bad, good = state["devices"][0]["uuid"], state["devices"][1]["uuid"]
        await until(lambda: daemon.store.health.get(bad) and daemon.store.health[bad].state == "healthy",
                     "GPU 0 assessed healthy")
        state["events"] = [{"seq": 1, "uuid": bad, "type": "xid", "data": 48}]
        write_sim_state(state)
        await until(lambda: _health(daemon, bad)["state"] == "unhealthy", "GPU 0 unhealthy after Xid 48")
        metrics, status = await _get(daemon.url)
        h = next(g["health"] for g in status["gpus"] if g["uuid"] == bad)
        assert h["action"] == "reset_gpu" and "Xid 48" in h["reason"] and h["evidence"] == ["GpuXidError"]
        assert f'gpuwatchd_gpu_health_state{{state="unhealthy",uuid="{bad}"}} 1.0' in metrics
        assert f'gpuwatchd_gpu_health_state{{state="healthy",uuid="{bad}"}} 0.0' in metrics
        assert f'gpuwatchd_gpu_health_state{{state="healthy",uuid="{good}"}} 1.0' in metrics
        assert next(g["health"] for g in status["gpus"] if g["uuid"] == good)["state"] == "healthy"
        assert daemon.ready()  # /readyz does not look at health
        text = render_status(*await fetch_status(daemon.url))  # what `gpuwatchd status` prints
        row = next(line for line in text.splitlines() if line.rstrip().endswith(bad))
        assert " unhealthy " in row
        assert any(line.startswith("GPU 0 unhealthy: ") and "Xid 48" in line for line in text.splitlines()), text
        # What to do: the advice its GpuXidError carries (rules/advice.py), the same text chat got.
        assert f"  What to do: {h['action_text']}" in text.splitlines(), text
        assert "reset it (nvidia-smi -r -i 0)" in h["action_text"]
        # The Xid alert resolves after rules.xid.resolve_after without a repeat: the GPU is healthy again.
        await until(lambda: _health(daemon, bad)["state"] == "healthy", "GPU 0 healthy again")
    finally:
        await daemon.stop()


async def test_probe_availability_is_exported_from_the_start_without_gpus_or_driver(
        tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    for name, state, probes in (("no GPUs", make_state(0), {"enabled": False}),
                                ("driver down", make_state(1, init_error="DRIVER_NOT_LOADED"), {"enabled": True})):
        path = write_sim_state(state)
        daemon = Daemon(config_from_dict(_config(tmp_path / name, standin_libdir, **probes)),
                        worker_env={STATE_ENV: str(path)})
        await daemon.start()
        try:
            await until(lambda d=daemon: d.store.latest is not None, f"{name}: the first NVML result")
            metrics, status = await _get(daemon.url)
            assert "gpuwatchd_probe_available 0.0" in metrics, name
            reason = status["probes"]["unavailable_reason"]
            assert f'gpuwatchd_probe_unavailable_info{{reason="{reason}"}} 1.0' in metrics, name
            spec = importlib.util.find_spec("torch")
            if not probes["enabled"]:
                assert reason == "disabled"
            elif spec is not None and torch_cuda_build(spec.submodule_search_locations) is False:
                assert reason == "torch_without_cuda"  # CI's torch: read from version.py, no worker started
            else:
                assert reason in ("torch_not_installed", "no_cuda_device", "driver_too_old", "check_failed"), reason
        finally:
            await daemon.stop()


async def test_an_application_xid_repeating_across_jobs_escalates_to_the_gpu(
        tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    """Xid 31 once: GpuXidError (the job's bug, restart the app). Three bursts more than burst_gap apart:
    GpuXidRepeated, the GPU degraded with "inspect the hardware"; the Xid table of `status` shows the catalog."""
    state = make_state(2)
    path = write_sim_state(state)
    daemon = Daemon(config_from_dict(_config(tmp_path, standin_libdir)), worker_env={STATE_ENV: str(path)})
    await daemon.start()
    try:
        uuid = state["devices"][0]["uuid"]
        await until(lambda: daemon.store.health.get(uuid), "GPU 0 assessed")
        for seq in (1, 2, 3):
            state["events"] = [{"seq": seq, "uuid": uuid, "type": "xid", "data": 31}]
            write_sim_state(state)
            await until(lambda s=seq: daemon.store.xid_counts.get((uuid, 31), 0) >= s, f"Xid 31 #{seq}")
            if seq == 1:
                await until(lambda: _health(daemon, uuid)["action"] == "restart_app", "restart the app after one")
                assert not [a for a in daemon.alerts if a.name == "GpuXidRepeated"]
            await asyncio.sleep(1.5)  # past burst_gap: the next one is another job
        await until(lambda: [a for a in daemon.alerts if a.name == "GpuXidRepeated" and a.state == "firing"],
                     "GpuXidRepeated")
        h = _health(daemon, uuid)
        assert (h["state"], h["action"]) == ("degraded", "inspect_hardware")
        _, status = await _get(daemon.url)
        (row,) = [x for x in status["xid_counts"] if x["uuid"] == uuid]
        assert row["count"] == 3 and row["catalog"]["immediate_action"] == "RESTART_APP"
        assert row["catalog"]["investigatory_action"] == "WORKFLOW_XID_31"
        assert status["xid_catalog"]["codes"] >= 170 and status["xid_catalog"]["source"].startswith("https://")
        text = render_status(*await fetch_status(daemon.url))
        # The table's advice is the daemon's (xid_counts[].action), never the catalog's raw buckets.
        assert row["action"] and "RESTART_APP" not in text and "WORKFLOW_XID_31" not in text
        assert any(line.split()[:3] == ["0", "31", "3"] and "FIFO_ERROR_MMU_ERR_FLT" in line
                   and line.rstrip().endswith(row["action"]) for line in text.splitlines()), text
    finally:
        await daemon.stop()


async def test_a_mig_device_has_its_own_health_and_its_gpus_when_worse(
        tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]) -> None:
    """MIG devices are assessed (they stayed "unknown" for good): healthy with their GPU; an Xid 48 on the GPU
    makes every slice of it unhealthy, saying it is the GPU's fault and what to do; recovered with the GPU."""
    state = make_state(0, devices=[a100()])
    path = write_sim_state(state)
    daemon = Daemon(config_from_dict(_config(tmp_path, standin_libdir)), worker_env={STATE_ENV: str(path)})
    await daemon.start()
    try:
        gpu = state["devices"][0]["uuid"]
        migs = [m["uuid"] for m in state["devices"][0]["mig_devices"]]
        def states() -> set[str]:
            health = {g["uuid"]: g["health"]["state"] for g in daemon.status()["gpus"]}
            return {health.get(u, "not listed yet") for u in (gpu, *migs)}

        await until(lambda: states() == {"healthy"}, "the GPU and its MIG devices assessed healthy")
        state["events"] = [{"seq": 1, "uuid": gpu, "type": "xid", "data": 48}]
        write_sim_state(state)
        await until(lambda: states() == {"unhealthy"}, "the GPU and its MIG devices unhealthy after Xid 48")
        metrics, status = await _get(daemon.url)
        for mig in migs:
            h = next(g["health"] for g in status["gpus"] if g["uuid"] == mig)
            assert h["reason"].startswith(f"the GPU it is part of ({gpu}) is unhealthy: "), h
            assert "Xid 48" in h["reason"] and h["action"] == "reset_gpu" and h["evidence"] == ["GpuXidError"]
            assert f'gpuwatchd_gpu_health_state{{state="unhealthy",uuid="{mig}"}} 1.0' in metrics
        text = render_status(*await fetch_status(daemon.url))  # what `gpuwatchd status` prints
        for mig in migs:
            row = next(line for line in text.splitlines() if line.rstrip().endswith(mig))
            assert " unhealthy " in row, text
        assert any(line.startswith("GPU 0 (NVIDIA A100-SXM4-80GB MIG 1g.10gb) unhealthy: the GPU it is part of")
                   for line in text.splitlines()), text
        await until(lambda: states() == {"healthy"}, "the GPU and its MIG devices healthy again")
    finally:
        await daemon.stop()
