"""Per-process SM / memory / encoder / decoder utilization (runs only inside the NVML worker process).

Two NVML calls give it (nvml.h): ``nvmlDeviceGetProcessesUtilizationInfo`` (R550+, a versioned
``nvmlProcessesUtilizationInfo_v1_t`` holding the sample array) and the older ``nvmlDeviceGetProcessUtilization``
(Maxwell+, a caller-sized ``nvmlProcessUtilizationSample_t`` array). Both return only samples newer than
``lastSeenTimeStamp`` (CPU microseconds), one per process "that had some non-zero utilization during the last
sample period", and NVML_ERROR_NOT_FOUND when there is none. So a process with no sample since the previous query
had zero utilization since then: a known 0, not an unknown.

Like the other readings (``nvml_readings.py``), the versioned call is tried first and, until one has worked, an
ABSENT code (not supported, missing symbol, refused struct version) moves to the older call; with none left the
reading is absent for the life of the worker. The buffer is kept per device and only grows when the driver answers
INSUFFICIENT_SIZE (one call per poll, not pynvml's size-then-data pair).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.worker.errors import ABSENT_CODES

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    Handle = Any
# pid -> [sm, memory, encoder, decoder] in percent, as NVML reports them
Utilization = dict[int, list[int]]

# nvmlProcessUtilizationInfo_v1_t (nvml.h): ull timeStamp; uint pid, smUtil, memUtil, encUtil, decUtil, jpgUtil,
# ofaUtil -- 36 bytes of fields, padded to 40 in an array (the trailing "0Q" aligns the end like the C struct).
_INFO_V1 = struct.Struct("@QIIIIIII0Q")
# nvmlProcessUtilizationSample_t (nvml.h): uint pid; ull timeStamp; uint smUtil, memUtil, encUtil, decUtil -- native
# alignment pads the pid to 8: 32 bytes.
_SAMPLE = struct.Struct("@IQIIII0Q")
_INITIAL_CAPACITY = 64


class _ProcessesUtilizationInfoV1(ctypes.Structure):
    # nvmlProcessesUtilizationInfo_v1_t (nvml.h): version, processSamplesCount, lastSeenTimeStamp, procUtilArray
    _fields_ = [("version", ctypes.c_uint), ("processSamplesCount", ctypes.c_uint),
                ("lastSeenTimeStamp", ctypes.c_ulonglong), ("procUtilArray", ctypes.c_void_p)]


# NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1) = sizeof | 1 << 24 (nvml.h; pynvml ProcessesUtilizationInfo_v1)
INFO_VERSION_V1 = ctypes.sizeof(_ProcessesUtilizationInfoV1) | 1 << 24
# The calls best first; the names are what the worker logs and the tests omit.
CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")


class ProcessUtilization:
    """One device's per-process utilization reader: ``read(handle)`` -> {pid: ratios} of the samples newer than
    the previous read (empty when there are none: NOT_FOUND). Raises ``pynvml.NVMLError`` for other failures;
    ``absent`` is set once no call is left, and ``on_settled(level, ok)`` hears of it and of a fallback in use."""

    __slots__ = ("_buf", "_cap", "_info", "absent", "confirmed", "last_seen", "level", "on_settled")

    def __init__(self, on_settled: Callable[[int, bool], None] | None = None) -> None:
        self.level = 0  # index into CALLS
        self.absent = False
        self.confirmed = False
        self.last_seen = 0  # the newest sample timestamp seen (nvml.h: "since the previous query")
        self.on_settled = on_settled
        self._cap = _INITIAL_CAPACITY
        self._buf = ctypes.create_string_buffer(self._cap * _INFO_V1.size)
        self._info = _ProcessesUtilizationInfoV1()

    def read(self, handle: Handle) -> Utilization:
        while True:
            try:
                result = self._call(handle)
            except N.NVMLError as e:
                if e.value not in ABSENT_CODES or self.confirmed:
                    raise
                if self.level + 1 < len(CALLS):
                    self.level += 1
                    continue
                self.absent = True
                if self.on_settled is not None:
                    self.on_settled(self.level, False)
                raise
            if not self.confirmed:
                self.confirmed = True
                if self.level and self.on_settled is not None:
                    self.on_settled(self.level, True)
            return result

    def _call(self, handle: Handle) -> Utilization:
        fn = N._nvmlGetFunctionPointer(CALLS[self.level])
        if self.level == 0:
            rows = self._info_v1(fn, handle)
            pid_at, ts_at = 1, 0
        else:
            rows = self._samples(fn, handle)
            pid_at, ts_at = 0, 1
        out: Utilization = {}
        newest: dict[int, int] = {}
        last = self.last_seen
        for r in rows:
            pid, ts = r[pid_at], r[ts_at]
            last = max(last, ts)
            if ts >= newest.get(pid, -1):  # the driver's buffer may hold several periods: keep each pid's newest
                newest[pid] = ts
                out[pid] = [r[2], r[3], r[4], r[5]]
        self.last_seen = last
        return out

    def _grow(self, count: int, size: int) -> None:
        self._cap = count * 2 + 5
        self._buf = ctypes.create_string_buffer(self._cap * size)

    def _info_v1(self, fn: Any, handle: Handle) -> list[tuple[int, ...]]:
        info = self._info
        for _ in range(2):
            info.version = INFO_VERSION_V1
            info.processSamplesCount = self._cap
            info.lastSeenTimeStamp = self.last_seen
            info.procUtilArray = ctypes.addressof(self._buf)
            ret = fn(handle, ctypes.byref(info))
            if ret != N.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            self._grow(info.processSamplesCount, _INFO_V1.size)
        return self._rows(ret, info.processSamplesCount, _INFO_V1)

    def _samples(self, fn: Any, handle: Handle) -> list[tuple[int, ...]]:
        for _ in range(2):
            count = ctypes.c_uint(self._cap)
            ret = fn(handle, self._buf, ctypes.byref(count), ctypes.c_ulonglong(self.last_seen))
            if ret != N.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            self._grow(count.value, _INFO_V1.size)  # sized for the larger struct: either call can use it
        return self._rows(ret, count.value, _SAMPLE)

    def _rows(self, ret: int, count: int, layout: struct.Struct) -> list[tuple[int, ...]]:
        """The ``count`` structs the driver wrote; none for NOT_FOUND (no sample since the last seen one)."""
        if ret == N.NVML_ERROR_NOT_FOUND:
            return []
        if ret != N.NVML_SUCCESS:
            raise N.NVMLError(ret)
        return list(layout.iter_unpack(ctypes.string_at(self._buf, min(count, self._cap) * layout.size)))


_ZERO = [0, 0, 0, 0]


def attach(processes: list[dict[str, Any]], util: Utilization) -> None:
    """Add ``utilization_percent`` to the kept processes' dicts (pipe encoding of ``ProcessSample``); a kept
    process without a sample since the previous read had zero utilization in that time (nvml.h)."""
    get = util.get
    for p in processes:
        p["utilization_percent"] = get(p["pid"], _ZERO)
