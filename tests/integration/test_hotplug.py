"""End to end over HTTP: eGPU unplug (lost -> removed -> replugged at a new index), and a hung NVML call.

The supervisor's tests cover the mechanics; these check what a user sees on /metrics and /api/v1/status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import ROOT, DaemonProcess, Samples, labels_of, metrics_when, value, wait_until

from gpuwatchd.sim.state import bus_id, make_device, make_state
from gpuwatchd.sources.sysfs.pcie import PCI_DEVICES

FAST_NVML = {"poll_interval": "100ms", "restart_backoff_initial": "100ms", "restart_backoff_max": "300ms"}


def gpu_state(d: DaemonProcess, uuid: str) -> str | None:
    status, body = d.get("/api/v1/status")
    assert status == 200
    return next((g["state"] for g in json.loads(body)["gpus"] if g["uuid"] == uuid), None)


def firing(d: DaemonProcess, alertname: str, uuid: str) -> bool:
    code, body = d.get("/api/v1/alerts")
    assert code == 200
    return any(
        a["labels"].get("alertname") == alertname and a["labels"].get("uuid") == uuid and a["state"] == "firing"
        for a in json.loads(body)
    )


def sysfs_bus_id(dev: dict[str, Any]) -> str:
    return bus_id(dev["pci"], legacy=True).lower()


def add_pci_function(sysfs_root: Path, bdf: str) -> None:
    """What the kernel shows when a GPU appears: an NVIDIA (0x10de) display-class (0x03) PCI function."""
    dev = sysfs_root / PCI_DEVICES / bdf
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030000\n")


def test_egpu_unplug_and_replug_at_a_new_index(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    state = make_state(2)
    internal, egpu = state["devices"]
    sysfs = tmp_path / "sysfs"
    for dev in (internal, egpu):
        add_pci_function(sysfs, sysfs_bus_id(dev))
    nvml = {"library_path": str(standin_libdir), **FAST_NVML}
    d = start_daemon({"nvml": nvml, "sysfs": {"root": str(sysfs)}}, write_sim_state(state))
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "two GPUs present")

    # Cable pulled: the eGPU falls off the bus and answers GPU_IS_LOST.
    egpu["lost"] = True
    write_sim_state(state)

    def gone(m: Samples) -> bool:
        return value(m, "gpuwatchd_gpu_present", uuid=egpu["uuid"]) == 0

    samples = metrics_when(d, gone, "the eGPU reported not present")
    assert value(samples, "gpuwatchd_gpu_memory_used_bytes", uuid=egpu["uuid"]) is None  # no values for a lost GPU
    assert value(samples, "gpuwatchd_gpu_memory_used_bytes", uuid=internal["uuid"]) is not None
    assert labels_of(samples, "gpuwatchd_gpu_info", uuid=egpu["uuid"])  # identity is kept
    assert gpu_state(d, egpu["uuid"]) in ("lost", "removed")
    # The rules run on the daemon's data and the alert is served (and shown by `gpuwatchd status`).
    wait_until(lambda: firing(d, "GpuLost", egpu["uuid"]), "GpuLost firing for the eGPU")
    status = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "status", "--url", d.url],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    alert_rows = [line.split() for line in status.stdout.splitlines() if line.startswith("GpuLost")]
    assert alert_rows and alert_rows[0][1:3] == ["critical", "firing"], status.stdout

    # The kernel removes it: the device count changes and a fresh enumeration no longer lists it.
    # A live NVML session keeps answering GPU_IS_LOST; the PCI function leaving sysfs is what triggers the rescan.
    state["devices"] = [internal]
    write_sim_state(state)
    shutil.rmtree(sysfs / PCI_DEVICES / sysfs_bus_id(egpu))
    wait_until(lambda: gpu_state(d, egpu["uuid"]) == "removed", "the eGPU marked removed")
    samples = d.metrics()
    assert gone(samples) and value(samples, "gpuwatchd_gpus") == 1
    assert value(samples, "gpuwatchd_nvml_devices") == 1
    restarts_before = value(samples, "gpuwatchd_nvml_worker_restarts_total") or 0

    # Plugged back in on another bus: same UUID, now enumerated first (index 0); the internal GPU moves to 1.
    # A running NVML session never sees a new device; the daemon notices the new PCI function in sysfs instead.
    replugged = make_device(0, uuid=egpu["uuid"], pci={**egpu["pci"], "bus": 0x71})
    state["devices"] = [replugged, internal]
    write_sim_state(state)
    add_pci_function(sysfs, sysfs_bus_id(replugged))

    def back(m: Samples) -> bool:
        info = labels_of(m, "gpuwatchd_gpu_info", uuid=egpu["uuid"])
        return value(m, "gpuwatchd_gpu_present", uuid=egpu["uuid"]) == 1 and info[0]["index"] == "0"

    samples = metrics_when(d, back, "the eGPU back at index 0")
    assert labels_of(samples, "gpuwatchd_gpu_info", uuid=egpu["uuid"])[0]["pci_bus_id"] == "00000000:71:00.0"
    assert labels_of(samples, "gpuwatchd_gpu_info", uuid=internal["uuid"])[0]["index"] == "1"
    assert value(samples, "gpuwatchd_gpus") == 2
    assert (value(samples, "gpuwatchd_nvml_worker_restarts_total") or 0) > restarts_before  # re-enumerated
    assert gpu_state(d, egpu["uuid"]) == "present"


def test_hung_nvml_call_keeps_metrics_answering(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
) -> None:
    state = make_state(2)
    nvml = {"library_path": str(standin_libdir), **FAST_NVML, "poll_timeout": "1s", "kill_grace": "200ms"}
    d = start_daemon({"nvml": nvml}, write_sim_state(state))
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "two GPUs present")
    assert value(samples, "gpuwatchd_nvml_stale") == 0
    restarts_before = value(samples, "gpuwatchd_nvml_worker_restarts_total") or 0

    uuid1 = next(dict(lab)["uuid"] for (n, lab), v in samples.items() if n == "gpuwatchd_gpu_info"
                 and dict(lab)["index"] == "1")
    uuid0 = next(dict(lab)["uuid"] for (n, lab), v in samples.items() if n == "gpuwatchd_gpu_info"
                 and dict(lab)["index"] == "0")

    # Every NVML call on GPU 1 now blocks forever, as in a wedged driver.
    state["devices"][1]["delays_ms"] = {"*": -1}
    write_sim_state(state)
    # Each scrape below must answer (metrics() asserts HTTP 200 within its 5 s client timeout) while NVML hangs.
    # GPU 1 is set aside and, once its call has blocked for poll_timeout while GPU 0 answered, shown lost;
    # GPU 0 keeps reporting from the same worker.
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_lost", uuid=uuid1) == 1, "GPU 1 shown lost")
    assert value(samples, "gpuwatchd_gpu_present", uuid=uuid0) == 1
    assert value(samples, "gpuwatchd_nvml_worker_restarts_total") == restarts_before
    ages = []
    for _ in range(5):  # GPU 0's readings keep advancing: its age stays far below the hang's length
        samples = metrics_when(d, lambda m: value(m, "gpuwatchd_gpu_reading_age_seconds", uuid=uuid0) is not None,
                               "GPU 0's reading age")
        ages.append(value(samples, "gpuwatchd_gpu_reading_age_seconds", uuid=uuid0))
        time.sleep(0.5)
    assert value(samples, "gpuwatchd_gpu_lost", uuid=uuid1) == 1 and min(a or 0 for a in ages) < 2
    assert d.get("/healthz")[0] == 200
    assert "blocked an NVML call for more than 1.0s while the other GPUs answered" in d.log()

    # The driver recovers: a retry worker finds GPU 1 answering and hands it back; nothing was stale.
    del state["devices"][1]["delays_ms"]
    write_sim_state(state)
    metrics_when(
        d,
        lambda m: value(m, "gpuwatchd_nvml_stale") == 0
        and value(m, "gpuwatchd_gpus") == 2
        and value(m, "gpuwatchd_source_success", source="nvml") == 1,
        "fresh data after the hang",
    )
    assert d.proc.poll() is None
