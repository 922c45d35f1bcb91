"""GPM activity metrics without DCGM (nvml.h "GPM Functions"; runs only inside the NVML worker process).

On Hopper and newer GPUs (and their MIG instances) NVML computes SM activity and occupancy, tensor and FP pipe
activity, DRAM bandwidth utilization and PCIe / NVLink rates from two samples of hardware counters. Each poll
takes one sample into one of two buffers allocated once, and the metrics come from (previous sample, this one):
averages over the poll interval. The first poll only samples, so it exports nothing, as does a GPU without GPM;
no value is ever made up.

:class:`GpmSampler` samples one device, a MIG device handle, or a GPU instance of a device
(``nvmlGpmMigSampleGet``); :class:`GpmReading` is the per-device reading the worker polls, which first asks
``nvmlGpmQueryDeviceSupport``.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import time
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.worker.errors import ABSENT_CODES, LOST_CODES, NvmlGpuLost, reason

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, ClassVar

    Handle = Any
    Out = dict[str, Any]

# nvml.h GPM rates are MiB/s (NVML_GPM_METRIC_PCIE_TX_PER_SEC ...); activities are percent 0.0-100.0.
MIB = 1024.0 * 1024.0
PERCENT = 0.01

# nvml.h metric id -> (GpuSample field, key within that dict field or None, factor to base units)
GPM_METRICS: dict[int, tuple[str, str | None, float]] = {
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gpm_graphics_activity_ratio", None, PERCENT),
    N.NVML_GPM_METRIC_SM_UTIL: ("gpm_sm_activity_ratio", None, PERCENT),
    N.NVML_GPM_METRIC_SM_OCCUPANCY: ("gpm_sm_occupancy_ratio", None, PERCENT),
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("gpm_tensor_activity_ratio", None, PERCENT),
    N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: ("gpm_tensor_pipe_activity_ratio", "hmma", PERCENT),
    N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: ("gpm_tensor_pipe_activity_ratio", "imma", PERCENT),
    N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: ("gpm_tensor_pipe_activity_ratio", "dfma", PERCENT),
    N.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: ("gpm_tensor_pipe_activity_ratio", "dmma", PERCENT),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("gpm_dram_activity_ratio", None, PERCENT),
    N.NVML_GPM_METRIC_FP64_UTIL: ("gpm_pipe_activity_ratio", "fp64", PERCENT),
    N.NVML_GPM_METRIC_FP32_UTIL: ("gpm_pipe_activity_ratio", "fp32", PERCENT),
    N.NVML_GPM_METRIC_FP16_UTIL: ("gpm_pipe_activity_ratio", "fp16", PERCENT),
    N.NVML_GPM_METRIC_INTEGER_UTIL: ("gpm_pipe_activity_ratio", "integer", PERCENT),
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("gpm_pcie_bytes_per_second", "tx", MIB),
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("gpm_pcie_bytes_per_second", "rx", MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("gpm_nvlink_bytes_per_second", "tx", MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("gpm_nvlink_bytes_per_second", "rx", MIB),
}
# nvmlGpmMetric_t (nvml.h): uint metricId; nvmlReturn_t nvmlReturn; double value; metricInfo (three char *). The
# results are unpacked from the request's memory in one go: pynvml's per-attribute reads of ~17 structs a device
# were most of the reading's cost.
_METRIC = struct.Struct("@Iid24x")  # metricInfo's three pointers skipped (24 bytes on the 64-bit hosts NVML runs on)
ERROR_KEY = "gpm"  # GpuSample.errors key of a failed sample or metrics call; one metric's is its field[.key]


def _error_key(metric_id: int) -> str:
    field, key, _ = GPM_METRICS[metric_id]
    return f"{field}.{key}" if key else field  # like "clocks_hz.graphics": the GpuSample field it leaves empty


class GpmSampler:
    """Two sample buffers of one device or GPU instance, and the metrics between consecutive samples.

    ``handle`` is a device or MIG device handle (``nvmlGpmSampleGet``); with ``gpu_instance_id`` it is the parent
    device and the samples are of that GPU instance (``nvmlGpmMigSampleGet``). The buffers are allocated here and
    freed by :meth:`close`, which the owner calls when the device goes (re-enumeration, loss, worker exit).

    :meth:`read` raises ``NvmlGpuLost`` for GPU_IS_LOST / RESET_REQUIRED and otherwise puts a failed call in
    ``errors``; :attr:`absent` becomes true when the driver answers NOT_SUPPORTED / FUNCTION_NOT_FOUND /
    ARGUMENT_VERSION_MISMATCH before any sample or metrics call has worked (the buffers are then freed).
    """

    __slots__ = ("_buffers", "_computed", "_current", "_get", "_ids", "_last", "_plan", "_prev_ok", "_sampled",
                 "_taken", "absent", "gpu_instance", "handle")

    # Polls closer than this to the last sample take none and repeat the last metrics (0: sample every poll, as
    # tests and bench/poll.py do against the stand-in, whose counters have no refresh rate). Process-wide: the
    # worker sets it from its gpm_min_interval option; clock is injectable for tests.
    min_interval: ClassVar[float] = 0.0
    clock: ClassVar[Callable[[], float]] = time.monotonic

    def __init__(self, handle: Handle, gpu_instance_id: int | None = None) -> None:
        self.handle = handle
        self.gpu_instance = gpu_instance_id
        self.absent = False
        self._ids = list(GPM_METRICS)
        self._buffers: list[Any] = []
        first = N.nvmlGpmSampleAlloc()
        try:
            self._buffers = [first, N.nvmlGpmSampleAlloc()]
        except N.NVMLError:
            N.nvmlGpmSampleFree(first)
            raise
        self._current = 0
        self._prev_ok = False
        self._taken = 0.0  # clock() at the last good sample
        self._last: dict[str, Any] = {}  # the metrics of the last pair, repeated on polls that take no sample
        self._sampled = self._computed = False  # a call has worked: a later refusal is an error, not a fact
        # One request struct for the life of the device: only the sample pointers alternate.
        self._get = N.c_nvmlGpmMetricsGet_t()
        self._get.version = N.NVML_GPM_METRICS_GET_VERSION
        self._set_ids(self._ids)

    def _set_ids(self, ids: list[int]) -> None:
        self._ids = ids
        self._plan = [(m, *GPM_METRICS[m]) for m in ids]  # the per-poll loop's lookups, done once
        self._get.numMetrics = len(ids)
        for i, metric in enumerate(ids):
            self._get.metrics[i].metricId = metric

    def _failed(self, e: N.NVMLError, confirmed: bool, errors: dict[str, str]) -> None:
        if e.value in LOST_CODES:
            raise NvmlGpuLost(e.value, ERROR_KEY) from None
        if e.value in ABSENT_CODES and not confirmed:
            self.close()
            self.absent = True
        else:
            errors[ERROR_KEY] = reason(e.value)

    def read(self, out: Out, errors: dict[str, str]) -> None:
        """Take a sample; from the second good one on, write the metrics since the previous into ``out``."""
        if self.absent:
            return
        if self.min_interval:
            now = GpmSampler.clock()
            if self._prev_ok and now - self._taken < self.min_interval:
                for field, v in self._last.items():
                    out[field] = dict(v) if isinstance(v, dict) else v
                return
            self._taken = now
        sample = self._buffers[self._current]
        try:
            if self.gpu_instance is None:
                N.nvmlGpmSampleGet(self.handle, sample)
            else:
                N.nvmlGpmMigSampleGet(self.handle, self.gpu_instance, sample)
        except N.NVMLError as e:
            self._prev_ok = False  # the next good sample starts a new pair
            self._failed(e, self._sampled, errors)
            return
        self._sampled = True
        previous = self._buffers[self._current ^ 1]
        self._current ^= 1
        if not self._prev_ok:
            self._prev_ok = True
            self._last = {}
            return
        get = self._get
        get.sample1, get.sample2 = previous, sample
        try:
            N.nvmlGpmMetricsGet(get)
        except N.NVMLError as e:
            self._failed(e, self._computed, errors)
            return
        raw = ctypes.string_at(ctypes.addressof(get.metrics), len(self._ids) * _METRIC.size)
        unsupported = []
        got: dict[str, Any] = {}
        for (metric, field, key, factor), (_, ret, value) in zip(self._plan, _METRIC.iter_unpack(raw), strict=True):
            if ret:
                if ret == N.NVML_ERROR_NOT_SUPPORTED and not self._computed:
                    unsupported.append(metric)
                else:  # only this metric has no sample this poll
                    errors[_error_key(metric)] = reason(ret)
            elif key is None:
                got[field] = value * factor
            else:
                got.setdefault(field, {})[key] = value * factor
        out.update(got)
        self._last = got
        if not self._computed:
            self._computed = True
            if unsupported:  # learned once, like the field values: not asked again
                self._set_ids([m for m in self._ids if m not in unsupported])
                if not self._ids:
                    self.close()
                    self.absent = True

    def close(self) -> None:
        """Free the sample buffers (idempotent; the driver keeps them until then)."""
        buffers, self._buffers = self._buffers, []
        for b in buffers:
            with contextlib.suppress(N.NVMLError):
                N.nvmlGpmSampleFree(b)
        self.absent = True


class GpmReading:
    """A device's GPM reading: asks ``nvmlGpmQueryDeviceSupport`` once, then samples every poll.

    Where GPM is not supported (pre-Hopper GPUs, older drivers without the symbols) it is learned absent on the
    first poll and costs nothing after; transient failures of the support query are retried on the next poll.
    """

    __slots__ = ("absent", "gpu_instance_id", "handle", "sampler")

    def __init__(self, handle: Handle, gpu_instance_id: int | None = None) -> None:
        """``gpu_instance_id``: read that GPU instance of device ``handle`` (a MIG device's,
        sources/nvml/worker/mig.py)."""
        self.handle = handle
        self.gpu_instance_id = gpu_instance_id
        self.absent = False
        self.sampler: GpmSampler | None = None

    def poll(self, out: Out, errors: dict[str, str]) -> None:
        if self.absent:
            return
        if self.sampler is None:
            try:
                supported = N.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice
                if supported:
                    self.sampler = GpmSampler(self.handle, self.gpu_instance_id)
            except N.NVMLError as e:
                if e.value in LOST_CODES:
                    raise NvmlGpuLost(e.value, ERROR_KEY) from None
                if e.value in ABSENT_CODES:
                    self.absent = True
                else:
                    errors[ERROR_KEY] = reason(e.value)
                return
            if not supported:
                self.absent = True
                return
        assert self.sampler is not None
        self.sampler.read(out, errors)
        if self.sampler.absent:
            self.absent = True

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
