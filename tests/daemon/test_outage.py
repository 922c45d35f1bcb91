"""The NVML outage log: one line per outage or change of reason, one when NVML is back."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.config.loader import NvmlConfig, config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.model import Snapshot
from gpuwatchd.runtime.nvml_outage import NvmlOutageLog
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state


def down(reason: str) -> Snapshot:
    return Snapshot(timestamp=0.0, nvml_ok=False, nvml_error=reason)


UP = Snapshot(timestamp=0.0, nvml_ok=True, driver_version="535.161.08")


def test_each_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gpuwatchd.daemon")
    outage = NvmlOutageLog()
    nvml = NvmlConfig()
    for snap in [down("library_not_found")] * 5 + [down("driver_not_loaded")] * 3 + [UP, UP, down("timeout")]:
        outage.observe(snap, nvml)
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "no NVIDIA driver found (libnvidia-ml.so.1 not on the library search path: library_not_found)",
        "no NVIDIA driver found (libnvidia-ml.so.1 found but the nvidia kernel module is not loaded: "
        "driver_not_loaded)",
        "NVML is up: driver 535.161.08, 0 GPU(s)",
        "NVML unavailable (timeout)",
    ]
    assert (
        caplog.records[0]
        .getMessage()
        .endswith("retrying every 30s at most. To try gpuwatchd without a GPU: gpuwatchd sim --scenario idle")
    )


def test_names_the_configured_library_path(caplog: pytest.LogCaptureFixture) -> None:
    NvmlOutageLog().observe(down("library_not_found"), NvmlConfig(library_path=Path("/opt/nvidia/lib")))
    assert "(libnvidia-ml.so.1 not in /opt/nvidia/lib: library_not_found)" in caplog.text


# -- through the daemon and the stand-in -------------------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
WAIT_SECONDS = 30.0  # upper bound for a worker to start on a loaded 2-core box; tests end far sooner
RULES = Path(__file__).resolve().parents[2] / "dashboards" / "gpuwatchd.rules.yml"
# Series a GPU exports whatever NVML says: its identity and presence (runtime_families.presence_families).
# identity and presence, and how old the last readings are (they are not exported while NVML is down)
IDENTITY_SERIES = {"gpuwatchd_gpu_info", "gpuwatchd_gpu_present", "gpuwatchd_gpu_lost",
                   "gpuwatchd_gpu_last_seen_timestamp_seconds", "gpuwatchd_gpu_reading_age_seconds",
                   "gpuwatchd_gpu_health_state"}  # a state, not a reading: "unknown" while NVML is down


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    want = tuple(sorted(labels.items()))
    return next((v for (n, lab), v in samples.items() if n == name and all(i in lab for i in want)), None)


async def wait_for(cond: Callable[[], Awaitable[Any]], what: str) -> Any:
    end = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not (result := await cond()):
        assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return result


def sim_daemon(tmp_path: Path, libdir: Path, state: Path) -> Daemon:
    cfg = {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "nvml": {"library_path": str(libdir), "poll_interval": "100ms", "restart_backoff_initial": "50ms",
                 "restart_backoff_max": "200ms"},
        "sysfs": {"root": str(tmp_path / "sysfs")},
        "rules": {"expected_gpu_count": 2},
        "probes": {"enabled": False},  # the outage's log lines alone (torch here is a CPU build: a warning)
    }
    return Daemon(config_from_dict(cfg), worker_env={STATE_ENV: str(state)})


def logged(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> list[str]:
    """gpuwatchd messages at ``level`` or above that contain ``text``."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("gpuwatchd") and r.levelno >= level and text in r.getMessage()]


async def test_no_driver_is_one_line_for_the_whole_outage(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    libdir = tmp_path / "driver"  # no libnvidia-ml.so.1 in it yet
    libdir.mkdir()
    daemon = sim_daemon(tmp_path, libdir, write_sim_state(make_state(2)))
    await daemon.start()
    try:
        await wait_for(lambda: _true(daemon.supervisor.init_failures >= 4), "a few init retries")
        during = logged(caplog, "library_not_found")
        retries = [r for r in caplog.records if r.levelno == logging.DEBUG and "NVML unavailable" in r.getMessage()]
        (libdir / "libnvidia-ml.so.1").symlink_to(standin_libdir / "libnvidia-ml.so.1")  # the driver installed
        await wait_for(lambda: _true(daemon.store.latest is not None and daemon.store.latest.nvml_ok), "NVML up")
        up_at = daemon.store.version
        await wait_for(lambda: _true(daemon.store.version >= up_at + 5), "more polls after recovery")
    finally:
        await daemon.stop()
    assert len(during) == 1, during  # the one line, not one per retry (nor the worker's own stderr)
    assert during[0].startswith("no NVIDIA driver found (libnvidia-ml.so.1 not in ")
    assert during[0].endswith("To try gpuwatchd without a GPU: gpuwatchd sim --scenario idle")
    assert len(retries) >= 4
    assert logged(caplog, "NVML is up") == ["NVML is up: driver 535.161.08, 2 GPU(s)"]
    # the outage's one line is the only warning but the start-up notice that no receiver is configured
    notices = logged(caplog, "no notification receivers configured", logging.WARNING)
    assert len(notices) == 1
    assert [m for m in logged(caplog, "", logging.WARNING) if m not in notices] == during


async def _true(x: bool) -> bool:
    return x


async def test_driver_outage_after_gpus_were_seen_is_nvml_down_not_gpus_lost(
    tmp_path: Path, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatchd")
    state = make_state(2)
    uuids = [d["uuid"] for d in state["devices"]]
    daemon = sim_daemon(tmp_path, standin_libdir, write_sim_state(state))
    await daemon.start()
    try:
        async def gpus_reporting() -> Samples | None:
            s = await scrape(daemon.url)
            return s if value(s, "gpuwatchd_gpu_memory_used_bytes", uuid=uuids[1]) is not None else None

        healthy = await wait_for(gpus_reporting, "both GPUs on /metrics")
        # The driver package is upgraded under the running daemon: every new NVML session now fails to init.
        write_sim_state(make_state(2, init_error="LIB_RM_VERSION_MISMATCH"))
        daemon.supervisor.request_restart("test: a fresh worker meets the upgraded library")

        async def nvml_down() -> Samples | None:
            s = await scrape(daemon.url)
            return s if value(s, "gpuwatchd_nvml_up") == 0 else None

        await wait_for(nvml_down, "nvml_up 0")
        await wait_for(lambda: _true(daemon.supervisor.init_failures >= 4), "a few init retries")
        down = await scrape(daemon.url)
        alerts = daemon.evaluate()
        write_sim_state(state)  # rebooted into the new driver: same GPUs, same UUIDs
        await wait_for(gpus_reporting, "GPU values back")
    finally:
        await daemon.stop()

    assert value(down, "gpuwatchd_nvml_error_info", reason="lib_rm_version_mismatch") == 1
    for uuid in uuids:  # presence is the last known fact; the readings are not exported while unknown
        assert value(down, "gpuwatchd_gpu_present", uuid=uuid) == 1
        assert value(down, "gpuwatchd_gpu_lost", uuid=uuid) == 0
    assert value(down, "gpuwatchd_gpus") == 2
    assert all((value(down, "gpuwatchd_gpu_reading_age_seconds", uuid=u) or 0) > 0 for u in uuids)
    assert all(value(down, "gpuwatchd_gpu_health_state", uuid=u, state="unknown") == 1 for u in uuids)
    gpu_series = {n for n, _ in down if n.startswith("gpuwatchd_gpu_")} - IDENTITY_SERIES
    assert {n for n, _ in healthy if n.startswith("gpuwatchd_gpu_memory")} and gpu_series == set(), gpu_series
    # the daemon's own rules: a driver outage is not a lost, removed or missing GPU
    assert [a.name for a in alerts if a.name in {"GpuLost", "GpuRemoved", "GpuCountLow"}] == []
    # one line for the outage, with what to do, and one when NVML is back
    out = logged(caplog, "lib_rm_version_mismatch")
    assert out == ["NVML unavailable (lib_rm_version_mismatch: the NVIDIA library and kernel module differ, as "
                   "after a driver upgrade without a reboot: reboot, or reload the nvidia kernel modules); serving "
                   "metrics without GPU data; retrying every 0.2s at most"]
    assert logged(caplog, "NVML is up") == ["NVML is up: driver 535.161.08, 2 GPU(s)"]
    # the Prometheus rules shipped for fleets see the same: GpuwatchdNvmlDown, and no GPU alert
    verdict = promtool_verdict(tmp_path, healthy, down)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    # ...and the same check fails if presence had dropped with the driver (so passing above means something)
    dropped = {k: 0.0 if k[0] == "gpuwatchd_gpu_present" else v for k, v in down.items()}
    assert promtool_verdict(tmp_path, healthy, dropped).returncode != 0


def promtool_verdict(tmp_path: Path, before: Samples, during: Samples) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` over the scraped series: 5 min as before, then 10 min as during the outage."""
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    series = []
    for key in sorted(before.keys() | during.keys()):
        name, labels = key
        text = ",".join(f"{k}={json.dumps(v)}" for k, v in (*labels, ("instance", "h1"), ("job", "g")))
        timeline = [before.get(key)] * 5 + [during.get(key)] * 10  # "_": no sample at that step
        values = " ".join("_" if v is None else repr(float(v)) for v in timeline)
        series.append({"series": f"{name}{{{text}}}", "values": values})
    rules = yaml.safe_load(RULES.read_text())
    nvml_down = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuwatchdNvmlDown")
    annotations = {k: v.replace("{{ $labels.instance }}", "h1") for k, v in nvml_down["annotations"].items()}
    expect = [{"eval_time": "14m", "alertname": name, "exp_alerts": []}
              for name in ("GpuLost", "GpuRemoved", "GpuCountLow")]
    expect.append({"eval_time": "14m", "alertname": "GpuwatchdNvmlDown", "exp_alerts": [
        {"exp_labels": {"severity": "critical", "job": "g", "instance": "h1"}, "exp_annotations": annotations}]})
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": expect}]}
    path = tmp_path / "outage_rules_test.yml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run([exe, "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
