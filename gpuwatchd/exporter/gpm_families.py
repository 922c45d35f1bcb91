"""GPM activity families (``sources/nvml/worker/gpm.py``): SM, tensor, FP pipe, DRAM, PCIe and NVLink activity.

Hopper and newer GPUs and their MIG instances only; a GPU without GPM, and every GPU on the daemon's first poll,
has no sample in these families (never a 0 for "unknown"). Values are averages over the last poll interval.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.model import GpuSample

_U = ("uuid",)
_GPM = " GPM (nvmlGpmMetricsGet), averaged over the last poll interval; Hopper and newer GPUs and MIG instances."

GRAPHICS_ACTIVITY = spec(
    "gpuwatchd_gpu_graphics_engine_activity_ratio", "gauge",
    "Fraction of time the graphics/compute engine was active, 0..1." + _GPM, _U, "ratio",
)
SM_ACTIVITY = spec(
    "gpuwatchd_gpu_sm_activity_ratio", "gauge",
    "Fraction of SMs that were busy, averaged over time, 0..1 (a fuller picture than gpuwatchd_gpu_utilization_ratio,"
    " which is 1 while any kernel runs)." + _GPM, _U, "ratio",
)
SM_OCCUPANCY = spec(
    "gpuwatchd_gpu_sm_occupancy_ratio", "gauge",
    "Resident warps as a fraction of the SMs' theoretical maximum, 0..1." + _GPM, _U, "ratio",
)
TENSOR_ACTIVITY = spec(
    "gpuwatchd_gpu_tensor_activity_ratio", "gauge",
    "Fraction of time the SMs' tensor pipes (any precision) were active, 0..1." + _GPM, _U, "ratio",
)
TENSOR_PIPE_ACTIVITY = spec(
    "gpuwatchd_gpu_tensor_pipe_activity_ratio", "gauge",
    "Fraction of time the SMs did tensor operations of one kind, by pipe=hmma (FP16/BF16/TF32/FP8 matrix) | imma"
    " (integer matrix) | dfma | dmma (FP64 matrix), 0..1." + _GPM, ("uuid", "pipe"), "ratio",
)
PIPE_ACTIVITY = spec(
    "gpuwatchd_gpu_pipe_activity_ratio", "gauge",
    "Fraction of time the SMs did non-tensor math of one kind, by pipe=fp64|fp32|fp16|integer, 0..1." + _GPM,
    ("uuid", "pipe"), "ratio",
)
DRAM_ACTIVITY = spec(
    "gpuwatchd_gpu_dram_activity_ratio", "gauge",
    "Device memory bandwidth used as a fraction of the theoretical maximum, 0..1." + _GPM, _U, "ratio",
)
PCIE_RATE = spec(
    "gpuwatchd_gpu_pcie_average_bytes_per_second", "gauge",
    "PCIe traffic by direction=tx (from the GPU) | rx (to the GPU), averaged over the poll interval (the 20 ms"
    " window of gpuwatchd_gpu_pcie_throughput_bytes_per_second misses bursts)." + _GPM, ("uuid", "direction"),
)
NVLINK_RATE = spec(
    "gpuwatchd_gpu_nvlink_average_bytes_per_second", "gauge",
    "NVLink traffic over all links by direction=tx | rx." + _GPM, ("uuid", "direction"),
)


def gpm_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """The GPM activity of every GPU that has it."""
    f = Families()
    for g in gpus:
        u = (g.uuid,)
        f.add(GRAPHICS_ACTIVITY, u, g.gpm_graphics_activity_ratio)
        f.add(SM_ACTIVITY, u, g.gpm_sm_activity_ratio)
        f.add(SM_OCCUPANCY, u, g.gpm_sm_occupancy_ratio)
        f.add(TENSOR_ACTIVITY, u, g.gpm_tensor_activity_ratio)
        for pipe, ratio in sorted(g.gpm_tensor_pipe_activity_ratio.items()):
            f.add(TENSOR_PIPE_ACTIVITY, (g.uuid, pipe), ratio)
        for pipe, ratio in sorted(g.gpm_pipe_activity_ratio.items()):
            f.add(PIPE_ACTIVITY, (g.uuid, pipe), ratio)
        f.add(DRAM_ACTIVITY, u, g.gpm_dram_activity_ratio)
        for direction, rate in sorted(g.gpm_pcie_bytes_per_second.items()):
            f.add(PCIE_RATE, (g.uuid, direction), rate)
        for direction, rate in sorted(g.gpm_nvlink_bytes_per_second.items()):
            f.add(NVLINK_RATE, (g.uuid, direction), rate)
    return f.metrics()
