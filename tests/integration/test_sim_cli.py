"""`gpuwatchd sim` as users run it: named scenarios end to end over HTTP, then Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, START_SECONDS, DaemonProcess, Samples, free_port, labels_of, metrics_when, value, wait_until


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    running: list[DaemonProcess] = []
    yield running
    for d in running:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def start_sim(running: list[DaemonProcess], tmp_path: Path, *args: str) -> DaemonProcess:
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", tmp_path / "unused.yml", log_path)
    running.append(d)

    def serving() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{d.log()}"
        try:
            return d.get("/healthz", timeout=1)[0] == 200
        except OSError:
            return False

    wait_until(serving, "gpuwatchd sim to serve", START_SECONDS)
    return d


def interrupt(d: DaemonProcess) -> int:
    """SIGINT, then the exit code (on a non-zero one, the sim's log is printed: pytest shows it with the failure)."""
    d.proc.send_signal(signal.SIGINT)
    code = d.proc.wait(timeout=30)
    if code != 0:
        print(f"sim exited {code}; its log ends:\n{d.log()[-4000:]}")
    return code


def test_sim_no_driver(sim: list[DaemonProcess], tmp_path: Path) -> None:
    d = start_sim(sim, tmp_path, "--scenario", "no-driver")
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_nvml_up") == 0, "nvml_up 0")
    assert value(samples, "gpuwatchd_nvml_error_info", reason="library_not_found") == 1
    assert value(samples, "gpuwatchd_gpus") == 0
    status, body = d.get("/readyz")
    assert status == 200, body  # ready: a definite "no driver" is an answer
    assert d.log().count("no NVIDIA driver found") == 1
    assert interrupt(d) == 0


def test_sim_nvml_hang(sim: list[DaemonProcess], tmp_path: Path) -> None:
    # At 4x, the hang starts 1.25 s in and lasts 15 s; the 5 s poll deadline stays 5 s of real time (a floor).
    d = start_sim(sim, tmp_path, "--scenario", "nvml-hang", "--speed", "4")
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "both GPUs")
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 1, "GPU 1 shown lost while it hangs")
    assert value(samples, "gpuwatchd_nvml_up") == 1 and value(samples, "gpuwatchd_nvml_stale") == 0
    assert (value(samples, "gpuwatchd_nvml_worker_restarts_total") or 0) == 0  # GPU 0 never waited for it
    assert d.get("/healthz")[0] == 200
    assert interrupt(d) == 0


MY_SCENARIO = """\
name: my-box
description: One A100 with a job holding 30 GiB, for building a dashboard panel.
gpus: 1
devices:
  all:
    name: NVIDIA A100-SXM4-80GB
    memory: {total: 80GiB, reserved: 0, used: 30GiB}
timeline:
  - at: 0
    add_process: {gpu: 0, pid: 4242, name: python, user: alice, used_memory: 30GiB}
"""


def test_sim_runs_a_users_own_scenario_file(sim: list[DaemonProcess], tmp_path: Path) -> None:
    path = tmp_path / "my-box.yml"
    path.write_text(MY_SCENARIO)
    d = start_sim(sim, tmp_path, "--scenario", str(path), "--speed", "10")
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 1, "the scenario's GPU")
    assert value(samples, "gpuwatchd_gpu_memory_total_bytes") == 80 * 2**30
    assert value(samples, "gpuwatchd_gpu_process_memory_used_bytes", pid="4242", process="python") == 30 * 2**30
    info = [dict(lab) for (n, lab), v in samples.items() if n == "gpuwatchd_gpu_info" and v == 1]
    assert [i["name"] for i in info] == ["NVIDIA A100-SXM4-80GB"]
    assert interrupt(d) == 0


def test_sim_bad_scenario_file_names_the_step(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(MY_SCENARIO.replace("add_process", "add_proces"))
    res = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", str(path), "--listen", "127.0.0.1:0"],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "broken.yml" in res.stderr and "timeline[0]" in res.stderr


def test_sim_dock_unauthorized_then_enrolled(sim: list[DaemonProcess], tmp_path: Path) -> None:
    # At 10x the dock is authorized 9 s in: the real daemon's Thunderbolt watch reads the fake bus, then the GPU
    # appears behind it once its tunnel is up.
    d = start_sim(sim, tmp_path, "--scenario", "dock-unauthorized", "--speed", "10")
    uid = "c6030000-0062-0c0e-8328-a0e1c2a5f30b"
    samples = metrics_when(
        d, lambda m: value(m, "gpuwatchd_thunderbolt_device_authorized", unique_id=uid) == 0, "the unauthorized dock"
    )
    assert value(samples, "gpuwatchd_gpus") in (None, 0)
    assert value(samples, "gpuwatchd_thunderbolt_link_lanes", unique_id=uid, direction="rx") == 2
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 1, "the GPU behind the authorized dock")
    gpu = "GPU-40704070-1d2e-4c3b-9a5f-0c0e40704070"
    samples = metrics_when(
        d,
        lambda m: value(m, "gpuwatchd_thunderbolt_device_info", unique_id=uid, gpu_uuid=gpu) == 1,
        "the dock tied to its GPU",
    )
    assert value(samples, "gpuwatchd_thunderbolt_device_authorized", unique_id=uid) == 1
    (info,) = labels_of(samples, "gpuwatchd_thunderbolt_device_info", unique_id=uid)
    assert info == {"unique_id": uid, "vendor": "Razer", "name": "Core X", "generation": "3", "gpu_uuid": gpu}
    assert interrupt(d) == 0


def test_sim_xid_repeat_health_states(sim: list[DaemonProcess], tmp_path: Path) -> None:
    """`gpuwatchd sim --scenario xid-repeat`: Xid 31 in three jobs on GPU 0 and three fatal Xid 119 episodes on GPU 1
    escalate, and the per-GPU health state says so in /metrics and /api/v1/status; /readyz stays 200."""
    import json

    d = start_sim(sim, tmp_path, "--scenario", "xid-repeat", "--speed", "50")
    gpus = wait_until(lambda: json.loads(d.get("/api/v1/status")[1])["gpus"], "the GPUs in /api/v1/status")
    gpu0, gpu1 = (g["uuid"] for g in sorted(gpus, key=lambda g: g["index"]))

    def firing(m: Samples) -> set[tuple[str, str]]:
        return {(a["alertname"], a["uuid"]) for a in labels_of(m, "gpuwatchd_alerts", alertstate="firing")}

    samples = metrics_when(d, lambda m: {("GpuXidRepeated", gpu0), ("GpuXidSupportCase", gpu1)} <= firing(m),
                           "both escalations firing")
    assert value(samples, "gpuwatchd_gpu_health_state", uuid=gpu0, state="degraded") == 1
    assert value(samples, "gpuwatchd_gpu_health_state", uuid=gpu0, state="healthy") == 0
    assert value(samples, "gpuwatchd_gpu_health_state", uuid=gpu1, state="unhealthy") == 1
    health = {g["uuid"]: g["health"] for g in json.loads(d.get("/api/v1/status")[1])["gpus"]}
    assert health[gpu0]["action"] == "inspect_hardware" and "Xid 31" in health[gpu0]["reason"]
    assert health[gpu1]["state"] == "unhealthy" and health[gpu1]["action"] == "inspect_hardware"
    assert d.get("/readyz")[0] == 200
    assert interrupt(d) == 0
