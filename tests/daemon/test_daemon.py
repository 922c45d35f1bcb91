"""The daemon in-process against the stand-in NVML driver: metrics, readiness, reload, start-up failures, sd_notify."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.config.loader import Config, config_from_dict, load_config
from gpuwatchd.daemon import Daemon, ListenError, StateDirError, resolve_state_dir
from gpuwatchd.runtime.sdnotify import SdNotifier
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
WAIT_SECONDS = 30.0  # generous upper bound for a worker to start on a loaded 2-core box; tests end sooner


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    want = tuple(sorted(labels.items()))
    for (n, lab), v in samples.items():
        if n == name and all(item in lab for item in want):
            return v
    return None


async def wait_for(cond: Callable[[], Awaitable[Any]], what: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_SECONDS
    while True:
        result = await cond()
        if result:
            return result
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def sim_config(tmp_path: Path, libdir: Path, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "nvml": {"library_path": str(libdir), "poll_interval": "100ms", "restart_backoff_max": "500ms"},
        "sysfs": {"root": str(tmp_path / "sysfs")},
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
async def running(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> AsyncIterator[Daemon]:
    state = make_state(2)
    state["devices"][0]["memory"]["used"] = 3 * 1024**3
    path = write_sim_state(state)
    cfg_file = tmp_path / "gpuwatchd.yml"
    import yaml

    cfg_file.write_text(yaml.safe_dump(sim_config(tmp_path, standin_libdir)))
    daemon = Daemon(
        load_config(cfg_file, required=True),
        config_path=cfg_file,
        worker_env={STATE_ENV: str(path)},
    )
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


async def test_serves_gpu_values_from_the_standin(running: Daemon) -> None:
    uuid0 = make_state(2)["devices"][0]["uuid"]

    async def have_gpus() -> Samples | None:
        s = await scrape(running.url)
        return s if value(s, "gpuwatchd_gpu_memory_used_bytes", uuid=uuid0) is not None else None

    samples = await wait_for(have_gpus, "GPU values on /metrics")
    assert value(samples, "gpuwatchd_nvml_up") == 1
    assert value(samples, "gpuwatchd_gpu_memory_used_bytes", uuid=uuid0) == 3 * 1024**3
    assert value(samples, "gpuwatchd_gpus") == 2
    # self-metrics of the NVML source come from the real poll, not from a hand-filled store
    assert value(samples, "gpuwatchd_source_success", source="nvml") == 1
    duration = value(samples, "gpuwatchd_source_duration_seconds", source="nvml")
    assert duration is not None and duration > 0
    # the config in force was loaded at start: its time is known before any SIGHUP
    loaded = value(samples, "gpuwatchd_config_last_reload_success_timestamp_seconds")
    assert loaded is not None and loaded > 1e9
    assert value(samples, "gpuwatchd_config_last_reload_successful") == 1
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{running.url}/readyz") as r:
            assert r.status == 200
        async with s.get(f"{running.url}/api/v1/status") as r:
            status = await r.json()
    assert [g["uuid"] for g in status["gpus"]] == [d["uuid"] for d in make_state(2)["devices"]]
    assert status["daemon"]["listen"] == "127.0.0.1:0"


async def test_reload_bad_keeps_old_config_and_says_so(running: Daemon) -> None:
    assert running.config_path is not None
    old = running.config
    good_text = running.config_path.read_text()

    running.config_path.write_text(good_text + "processes:\n  top_n: lots\n")
    result = await running.reload()
    assert not result.ok
    assert result.problems == ["processes.top_n: Input should be a valid integer, unable to parse string as an integer"]
    assert running.config is old
    samples = await scrape(running.url)
    assert value(samples, "gpuwatchd_config_last_reload_successful") == 0

    running.config_path.write_text(good_text + "processes:\n  top_n: 3\n")
    result = await running.reload()
    assert result.ok and result.restart_needed == []
    assert running.config.processes.top_n == 3
    assert running.supervisor.processes.top_n == 3  # handed on to the NVML worker's supervisor
    samples = await scrape(running.url)
    assert value(samples, "gpuwatchd_config_last_reload_successful") == 1
    assert value(samples, "gpuwatchd_config_last_reload_success_timestamp_seconds") is not None


async def test_reload_reports_settings_that_need_a_restart(running: Daemon) -> None:
    assert running.config_path is not None
    running.config_path.write_text(running.config_path.read_text() + "history:\n  retention: 2h\n")
    result = await running.reload()
    assert result.ok and list(result.restart_needed) == ["history"]
    # the kernel-log source is set up at start (its reader, its saved position): a change says so too
    running.config_path.write_text(running.config_path.read_text() + "kernel_log:\n  dedup_window: 30s\n")
    result = await running.reload()
    assert result.ok and list(result.restart_needed) == ["kernel_log"]
    # so is the attribution source (its kubelet schedule, its proc and runtime paths)
    running.config_path.write_text(running.config_path.read_text() + "attribution:\n  kubernetes:\n    interval: 30s\n")
    result = await running.reload()
    assert result.ok and list(result.restart_needed) == ["attribution"]


async def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = config_from_dict({"listen": f"127.0.0.1:{port}", "state_dir": str(tmp_path)})
        daemon = Daemon(cfg)
        with pytest.raises(ListenError) as ei:
            await daemon.start()
    assert (
        str(ei.value) == f"cannot listen on 127.0.0.1:{port}: address already in use (another gpuwatchd or "
        "exporter?); choose one with --listen"
    )
    assert ei.value.exit_code == 4


async def test_state_dir_not_writable_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    daemon = Daemon(config_from_dict({"listen": "127.0.0.1:0", "state_dir": str(blocker / "state")}))
    with pytest.raises(StateDirError) as ei:
        await daemon.start()
    assert str(ei.value).startswith(f"state_dir: cannot write to {blocker / 'state'}: Not a directory.")
    assert ei.value.exit_code == 5


def test_state_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = config_from_dict({"state_dir": str(tmp_path / "explicit")})
    assert resolve_state_dir(explicit, {"STATE_DIRECTORY": "/nope"}) == tmp_path / "explicit"
    systemd = tmp_path / "systemd-state"
    assert resolve_state_dir(Config(), {"STATE_DIRECTORY": f"{systemd}:/other"}) == systemd
    # The default is not writable (here: below a regular file): fall back to the user's XDG state dir.
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr("gpuwatchd.runtime.startup.DEFAULT_STATE_DIR", blocker / "gpuwatchd")
    got = resolve_state_dir(Config(), {"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert got == tmp_path / "xdg" / "gpuwatchd" and got.is_dir()


async def test_systemd_notifications(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    sock_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(sock_path)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    notifier = SdNotifier({"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "100000"})  # ping every 50 ms
    daemon = Daemon(
        config_from_dict(sim_config(tmp_path, standin_libdir)),
        worker_env={STATE_ENV: str(write_sim_state(make_state(1)))},
        notifier=notifier,
    )
    received: list[str] = []

    async def recv_until(pred: Callable[[str], bool]) -> None:
        while True:
            msg = (await asyncio.wait_for(loop.sock_recv(listener, 4096), WAIT_SECONDS)).decode()
            received.append(msg)
            if pred(msg):
                return

    try:
        await daemon.start()
        await recv_until(lambda m: m.startswith("READY=1"))
        await recv_until(lambda m: m == "WATCHDOG=1")
        await recv_until(lambda m: "1 GPU(s)" in m)  # STATUS= follows the data
        await daemon.stop()
        await recv_until(lambda m: m.startswith("STOPPING=1"))
    finally:
        await daemon.stop()
        listener.close()
    ready = next(m for m in received if m.startswith("READY=1"))
    assert ready.splitlines()[1].startswith(f"STATUS=serving on {daemon.url}")
    assert received.index(ready) < received.index("WATCHDOG=1")


async def test_a_crashed_core_task_stops_the_daemon_with_exit_6(
    tmp_path: Path, standin_libdir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A supervisor that dies would leave the daemon serving frozen data: it stops instead, for systemd to restart."""
    from gpuwatchd.sources.nvml.supervisor import NvmlSupervisor

    async def crash(self: NvmlSupervisor) -> None:
        raise RuntimeError("injected supervisor crash")

    monkeypatch.setattr(NvmlSupervisor, "run", crash)
    daemon = Daemon(config_from_dict(sim_config(tmp_path, standin_libdir)))
    code = await asyncio.wait_for(daemon.serve(), WAIT_SECONDS)  # what `gpuwatchd run` exits with
    assert code == 6
    assert isinstance(daemon.failure, RuntimeError)
    assert "nvml supervisor ended unexpectedly: RuntimeError('injected supervisor crash'); stopping" in caplog.text
