"""All checks in order: driver, devices, each GPU, Thunderbolt docks, CUDA, the daemon."""

from __future__ import annotations

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.cuda import check_cuda
from gpuwatchd.doctor.daemon import check_daemon, fetch
from gpuwatchd.doctor.devices import check_devices, check_persistence
from gpuwatchd.doctor.driver import check_driver
from gpuwatchd.doctor.gpus import check_docks, check_gpu, gpu_docks
from gpuwatchd.doctor.kernel_log import KernelLog, read_file, read_ring
from gpuwatchd.doctor.nvml_probe import probe_nvml
from gpuwatchd.doctor.pcie_errors import check_pcie_errors, read_all
from gpuwatchd.doctor.report import Result


def run_checks(host: Host, kernel_log: KernelLog | None = None) -> list[Result]:
    """``kernel_log``: the ``--kernel-log`` file already read (the CLI reads it first: an unreadable one is a usage
    error, not a check result)."""
    aer_before = read_all(host)  # and after the NVML probe, whose replay window this spans
    nvml = probe_nvml(host)
    aer_after = read_all(host)
    status, alerts, why = fetch(host)
    xids = status.get("recent_xids") if status is not None else None
    klog = kernel_log
    if host.kernel_log is not None and klog is None:
        klog = read_file(host.kernel_log)
    elif xids is None:
        klog = read_ring(host)
    results = [*check_driver(host, nvml), *check_devices(host, nvml), *check_persistence(nvml.gpus)]
    docks = gpu_docks(host, nvml.gpus)
    for g in nvml.gpus:
        results += check_gpu(g, docks, xids if host.kernel_log is None else None, klog)
        if not g.get("error"):
            results.append(check_pcie_errors(f"gpu {g['index']}", g, nvml.replays.get(g["index"]), aer_before,
                                             aer_after))
    results += check_docks(docks)
    results += check_cuda(host, nvml)
    results += check_daemon(host, status, why, alerts)
    return results
