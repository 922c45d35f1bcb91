"""`gpuwatchd run` as a real process against the stand-in: serving, SIGHUP reload, SIGTERM, and no driver at all."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import DaemonProcess, metrics_when, value, wait_until

from gpuwatchd.sim.state import make_state

NO_DRIVER_LINE = "no NVIDIA driver found (libnvidia-ml.so.1 not in "
FAST_NVML = {"poll_interval": "100ms", "restart_backoff_initial": "100ms", "restart_backoff_max": "300ms"}


def test_serves_reloads_on_sighup_and_stops_on_sigterm(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
) -> None:
    state = make_state(2)
    state["devices"][1]["memory"]["used"] = 5 * 1024**3
    d = start_daemon({"nvml": {"library_path": str(standin_libdir), **FAST_NVML}}, write_sim_state(state))
    uuid1 = state["devices"][1]["uuid"]
    samples = metrics_when(
        d, lambda m: value(m, "gpuwatchd_gpu_memory_used_bytes", uuid=uuid1) is not None, "GPU values on /metrics"
    )
    assert value(samples, "gpuwatchd_gpu_memory_used_bytes", uuid=uuid1) == 5 * 1024**3
    assert value(samples, "gpuwatchd_nvml_up") == 1
    assert d.get("/readyz")[0] == 200

    good = d.config_path.read_text()
    d.config_path.write_text(good + "processes: {top_n: -5}\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: value(d.metrics(), "gpuwatchd_config_last_reload_successful") == 0, "the failed reload")
    assert "config reload failed; keeping the running config" in d.log()
    assert "processes.top_n: Input should be greater than or equal to 0" in d.log()
    assert value(d.metrics(), "gpuwatchd_nvml_up") == 1  # still running on the old config

    d.config_path.write_text(good)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: value(d.metrics(), "gpuwatchd_config_last_reload_successful") == 1, "the good reload")

    assert d.stop() == 0
    assert "stopping" in d.log()


def test_no_driver_then_driver_installed_without_restart(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    libdir = tmp_path / "driver"
    libdir.mkdir()  # empty: no libnvidia-ml.so.1 here yet
    d = start_daemon({"nvml": {"library_path": str(libdir), **FAST_NVML}}, write_sim_state(make_state(1)))

    def down_a_while() -> dict[Any, float] | None:
        m = d.metrics()
        # Several retries, so the "once per outage" log line is tested against repeats.
        return (
            m
            if value(m, "gpuwatchd_nvml_up") == 0
            and (value(m, "gpuwatchd_nvml_init_failures_total") or 0) >= 3
            # init retries on a driverless host are not worker restarts (no crash-loop look-alike)
            and value(m, "gpuwatchd_nvml_worker_restarts_total") == 0
            else None
        )

    samples = wait_until(down_a_while, "nvml_up 0 after a few retries")
    assert value(samples, "gpuwatchd_nvml_error_info", reason="library_not_found") == 1
    assert value(samples, "gpuwatchd_gpus") == 0
    assert d.get("/healthz")[0] == 200
    log = d.log()
    assert log.count(NO_DRIVER_LINE) == 1, log
    line = next(x for x in log.splitlines() if NO_DRIVER_LINE in x)
    assert line.endswith(
        "serving metrics without GPU data; retrying every 0.3s at most. "
        "To try gpuwatchd without a GPU: gpuwatchd sim --scenario idle"
    )

    shutil.copy2(standin_libdir / "libnvidia-ml.so.1", libdir / "libnvidia-ml.so.1")
    uuid = make_state(1)["devices"][0]["uuid"]
    metrics_when(d, lambda m: value(m, "gpuwatchd_nvml_up") == 1, "nvml_up 1 once installed")
    assert d.proc.poll() is None  # same process: picked up without a restart
    wait_until(lambda: value(d.metrics(), "gpuwatchd_gpu_present", uuid=uuid) == 1, "the GPU")
    assert "NVML is up: driver 535.161.08, 1 GPU(s)" in d.log()
