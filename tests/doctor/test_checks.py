"""Single checks on hand-made hosts: what the scenarios do not reach (nouveau, no module, device permissions,
installed torch, CUDA_VISIBLE_DEVICES, Xids, power limit, the config and state dir)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.cuda import check_cuda, probe_torch
from gpuwatchd.doctor.daemon import check_daemon
from gpuwatchd.doctor.devices import check_devices, check_persistence
from gpuwatchd.doctor.driver import check_driver, kernel_module_version
from gpuwatchd.doctor.gpus import check_gpu
from gpuwatchd.doctor.nvml_probe import NvmlFacts

OK_NVML = NvmlFacts(init="ok", system={"driver_version": "550.54.14", "cuda_driver_version": 12040, "count": 2})
GPU: dict[str, Any] = {
    "index": 0, "uuid": "GPU-a", "pci_bus_id": "0000:0c:00.0", "pcie_gen": 4, "pcie_max_gen": 4, "pcie_width": 16,
    "pcie_max_width": 16, "utilization_gpu": 90, "persistence_mode": 1, "power_limit_mw": 300000,
    "power_default_limit_mw": 300000, "remap_pending": False, "remap_failure": False, "retired_pending": False,
    "clocks_event_reasons": 0, "error": None,
}  # fmt: skip


def _status(results: list[Any]) -> dict[str, str]:
    return {r.check: r.status for r in results}


def test_open_kernel_module_version_line(tmp_path: Path) -> None:
    v = tmp_path / "proc/driver/nvidia/version"
    v.parent.mkdir(parents=True)
    v.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (dvs-builder@U16)\n"
    )
    assert kernel_module_version(Host(root=tmp_path)) == "560.35.03"


def test_no_module_and_nouveau_fail_with_fixes(tmp_path: Path) -> None:
    (tmp_path / "sys/module/nouveau").mkdir(parents=True)
    res = check_driver(Host(root=tmp_path), NvmlFacts(init="driver_not_loaded", init_message="Driver Not Loaded"))
    assert _status(res) == {"kernel module": "fail", "nouveau": "fail", "libnvidia-ml.so.1": "fail"}
    assert "blacklist" in res[1].fix and "modprobe nvidia" in res[0].fix


def test_library_newer_than_the_module_is_a_mismatch(tmp_path: Path) -> None:
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("550.54.14\n")
    nvml = NvmlFacts(init="ok", system={"driver_version": "550.90.07"})
    lib = check_driver(Host(root=tmp_path), nvml)[2]
    assert lib.status == "fail" and "library 550.90.07, kernel module 550.54.14" in lib.detail


def test_device_nodes_the_service_user_cannot_open(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        (dev / n).write_bytes(b"")
        (dev / n).chmod(0o600)
    # A user that exists on every Linux host and is neither root nor the files' owner.
    host = Host(root=tmp_path, service_user="nobody")
    res = check_devices(host, NvmlFacts(init="ok", system={"count": 1}))
    if os.getuid() == 65534:
        pytest.skip("running as nobody")
    assert _status(res) == {"device nodes": "pass", "device access": "fail"}
    assert "usermod -aG video nobody" in res[1].fix
    for n in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        (dev / n).chmod(0o666)
    assert _status(check_devices(host, NvmlFacts(init="ok", system={"count": 1}))) == {
        "device nodes": "pass", "device access": "pass"}
    assert _status(check_devices(host, NvmlFacts(init="ok", system={"count": 2})))["device nodes"] == "fail"


def test_persistence_off_warns() -> None:
    (r,) = check_persistence([GPU, {**GPU, "index": 1, "persistence_mode": 0}])
    assert (r.status, "GPU 1" in r.detail, "nvidia-persistenced" in r.fix) == ("warn", True, True)


@pytest.mark.parametrize(
    ("change", "check", "status", "words"),
    [
        ({"pcie_gen": 1, "utilization_gpu": 0}, "PCIe link", "pass", "a downshift to save power is normal"),
        ({"pcie_width": 8}, "PCIe link", "warn", "gen4 x8 of gen4 x16 while 90% busy"),
        ({"remap_failure": True}, "memory", "fail", "run out of spare rows"),
        ({"retired_pending": True}, "memory", "warn", "a page retirement pending"),
        ({"power_limit_mw": 200000}, "power limit", "warn", "200 W, below the board default 300 W"),
        ({"clocks_event_reasons": 0x1 | 0x4}, "clock events", "pass", "gpu_idle, sw_power_cap"),
        ({"clocks_event_reasons": 0x40}, "clock events", "warn", "hw_thermal"),
    ],
)
def test_gpu_checks(change: dict[str, Any], check: str, status: str, words: str) -> None:
    (r,) = [r for r in check_gpu({**GPU, **change}, (), None) if r.check == check]
    assert r.status == status and words in r.detail, r


def test_recent_xids_from_the_daemon() -> None:
    xids = [{"uuid": "GPU-a", "xid": 79}, {"uuid": "GPU-a", "xid": 13}, {"uuid": "GPU-b", "xid": 31}]
    (r,) = [r for r in check_gpu(GPU, (), xids) if r.check == "recent Xids"]
    assert r.status == "fail" and r.detail.startswith("Xid 13, 79 (2 events)") and r.fix.startswith("Xid 79:")
    (r,) = [r for r in check_gpu(GPU, (), [{"uuid": "GPU-a", "xid": 13}]) if r.check == "recent Xids"]
    assert r.status == "warn"
    assert [r.status for r in check_gpu(GPU, (), []) if r.check == "recent Xids"] == ["pass"]
    assert [r for r in check_gpu(GPU, (), None) if r.check == "recent Xids"] == []  # no daemon: no line


def test_unreadable_gpu() -> None:
    (r,) = check_gpu({"index": 1, "error": "gpu_is_lost"}, (), None)
    assert (r.group, r.status) == ("gpu 1", "fail") and "fallen off the bus" in r.fix


def test_installed_torch_in_a_child_process() -> None:
    # The CPU build installed here: a real child process imports it (this process never does).
    pytest.importorskip("importlib.metadata").version("torch")
    # another test in this worker may have imported torch already (the probe tests run the real kernels here)
    imported_before = "torch" in sys.modules
    facts = probe_torch(Host(python=sys.executable))
    assert facts["installed"] is True and facts["available"] is False
    if facts["cuda"] is None:
        (_, build) = check_cuda(Host(torch_facts=facts), OK_NVML)
        assert build.status == "warn" and "CPU-only" in build.detail and "download.pytorch.org" in build.fix
    assert ("torch" in sys.modules) == imported_before  # the probe imported it in the child, not here


def test_torch_missing_for_the_interpreter_is_an_answer_not_a_crash(tmp_path: Path) -> None:
    # The probe worker's --check in an interpreter where `import torch` fails: doctor reports "not installed".
    (tmp_path / "torch.py").write_text("raise ImportError('No module named torch')\n")
    repo = str(Path(__file__).resolve().parents[2])
    facts = probe_torch(Host(python=sys.executable, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{repo}"}))
    assert facts == {"installed": False}
    res = check_cuda(Host(torch_facts=facts), OK_NVML)
    assert [(r.check, r.status) for r in res] == [("driver CUDA", "pass"), ("torch", "warn")]


def test_torch_not_installed_is_a_warning_with_the_install_line() -> None:
    # Not "nothing to check": the compatibility users run doctor for cannot be judged (issue 17 part 5).
    res = check_cuda(Host(python="/opt/train/bin/python", torch_facts={"installed": False}), OK_NVML)
    assert [(r.check, r.status) for r in res] == [("driver CUDA", "pass"), ("torch", "warn")]
    assert "not installed for /opt/train/bin/python" in res[1].detail
    assert "/opt/train/bin/python -m pip install torch" in res[1].fix


def test_cuda_visible_devices_hiding_a_gpu() -> None:
    host = Host(env={"CUDA_VISIBLE_DEVICES": "0"}, torch_facts={
        "installed": True, "version": "2.5.1", "cuda": "12.1", "available": True, "device_count": 1})
    r = check_cuda(host, OK_NVML)[-1]
    assert r.status == "warn" and "CUDA_VISIBLE_DEVICES='0' hides" in r.detail and "unset" in r.fix


def test_a_hung_torch_is_killed_at_the_deadline(tmp_path: Path) -> None:
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    facts = probe_torch(Host(python=str(hang), deadline=1.0))
    assert facts == {"installed": True, "timed_out": True}
    (r,) = [r for r in check_cuda(Host(torch_facts=facts, deadline=1.0), OK_NVML) if r.check == "torch"]
    assert r.status == "fail" and "did not answer within 1 s" in r.detail


def test_daemon_config_and_state_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    from gpuwatchd.config.loader import Config
    from gpuwatchd.config.types import replace

    host = Host(config=replace(Config(), state_dir=ro / "state"), config_error="rules.leak: bad",
                config_path=Path("/etc/gpuwatchd/config.yml"))  # fmt: skip
    res = check_daemon(host, None, "no gpuwatchd reachable")
    got = _status(res)
    assert got["config"] == "fail" and got["running"] == "warn"
    if os.getuid() != 0:  # root writes anywhere
        assert got["state dir"] == "fail"
    res = check_daemon(Host(), {"nvml": {"ok": True, "stale": True}}, "")
    assert _status(res)["last NVML error"] == "warn"


def _bus_gpu(**over: Any) -> dict[str, Any]:
    return {**GPU, "pci_bus_id": "0000:06:00.0", **over}


def test_xids_from_a_saved_kernel_log(tmp_path: Path) -> None:
    from gpuwatchd.doctor.kernel_log import read_file

    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[  219.520000] NVRM: Xid (PCI:0000:06:00): 13, pid=4242, name=python3, Graphics Exception\n"
        "[  219.530000] usb 1-2: new high-speed USB device number 3\n"
        "[  220.000000] NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    )
    klog = read_file(log)
    (r,) = [r for r in check_gpu(_bus_gpu(), (), None, klog) if r.check == "recent Xids"]
    assert r.status == "warn" and r.detail.startswith("Xid 13 (1 events)")
    (r,) = [r for r in check_gpu(_bus_gpu(pci_bus_id="0000:41:00.0"), (), None, klog) if r.check == "recent Xids"]
    assert r.status == "fail" and r.fix.startswith("Xid 79:")


def test_fallen_off_the_bus_without_an_xid_from_the_ring(tmp_path: Path) -> None:
    from gpuwatchd.doctor.kernel_log import read_ring
    from gpuwatchd.sources.kmsg.parse import format_record

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_bytes(
        format_record(1, 5_000_000, "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.", level=3)
        + format_record(2, 5_000_100, "pcieport 0000:00:07.0: pciehp: Slot(1): Link Down")
    )
    klog = read_ring(Host(root=tmp_path))
    assert klog.error is None and len(klog.fallen) == 1
    (r,) = [r for r in check_gpu(_bus_gpu(), (), None, klog) if r.check == "recent Xids"]
    assert r.status == "fail" and "fell off the bus" in r.detail
    (r,) = [r for r in check_gpu(GPU, (), None, klog) if r.check == "recent Xids"]
    assert r.status == "pass"


def test_an_unreadable_ring_warns_with_the_way_round(tmp_path: Path) -> None:
    from gpuwatchd.doctor.kernel_log import read_ring

    klog = read_ring(Host(root=tmp_path))  # no dev/kmsg at all
    (r,) = [r for r in check_gpu(GPU, (), None, klog) if r.check == "recent Xids"]
    assert r.status == "warn" and "cannot read" in r.fix
