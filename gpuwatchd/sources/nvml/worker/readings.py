"""Per-device NVML readings with a capability cache (runs only inside the NVML worker process).

Each reading is a small function writing ``GpuSample`` fields (pipe encoding: a dict) from one or a few NVML
calls, with older-driver fallbacks listed after it. On a device's first attempts a reading that answers
NOT_SUPPORTED / FUNCTION_NOT_FOUND moves to its next fallback, and with none left it is dropped for the life of
the worker: the per-poll cost of an unsupported metric is zero. Once a reading has worked,
a later NOT_SUPPORTED (e.g. MIG switched on) is a per-poll error, retried, not a new fact about the device.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.protocol import log_line
from gpuwatchd.sources.nvml.worker.errors import ABSENT_CODES, LOST_CODES, NvmlGpuLost, reason
from gpuwatchd.sources.nvml.worker.fabric import p2p_reader, read_fabric
from gpuwatchd.sources.nvml.worker.field_values import FieldId, FieldValues
from gpuwatchd.sources.nvml.worker.gpm import GpmReading
from gpuwatchd.sources.nvml.worker.nvlink import NvLink
from gpuwatchd.sources.nvml.worker.process_util import CALLS as PROCESS_UTIL_CALLS
from gpuwatchd.sources.nvml.worker.process_util import ProcessUtilization

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    from gpuwatchd.sources.nvml.worker.nvlink import Sink

    Handle = Any
    Out = dict[str, Any]
    Reader = Callable[[Handle, Out], None]

MHZ = 1_000_000.0
# nvmlDeviceGetPcieThroughput reports KB/s (nvml.h); NVML's KB is 1024 bytes like the rest of its memory units.
PCIE_KB = 1024.0
NS = 1e-9


def _memory_v2(h: Handle, out: Out) -> None:
    m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    out["memory_total_bytes"] = m.total
    out["memory_used_bytes"] = m.used
    out["memory_reserved_bytes"] = m.reserved
    out["memory_free_bytes"] = m.free


def _memory_v1(h: Handle, out: Out) -> None:
    # v1 "used" includes the driver-reserved memory; the split is unknown on such drivers.
    m = N.nvmlDeviceGetMemoryInfo(h)
    out["memory_total_bytes"] = m.total
    out["memory_used_bytes"] = m.used
    out["memory_free_bytes"] = m.free


def _utilization(h: Handle, out: Out) -> None:
    u = N.nvmlDeviceGetUtilizationRates(h)
    out["utilization_gpu_ratio"] = u.gpu / 100.0
    out["utilization_memory_ratio"] = u.memory / 100.0


def _pstate(h: Handle, out: Out) -> None:
    p = N.nvmlDeviceGetPerformanceState(h)
    if p != N.NVML_PSTATE_UNKNOWN:
        out["pstate"] = p


def _temperature_v(h: Handle, out: Out) -> None:
    out["temperature_celsius"] = float(N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU))


def _temperature_v0(h: Handle, out: Out) -> None:
    # Deprecated in API 13 (nvml.h) but the only call before R565.
    out["temperature_celsius"] = float(N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))


def _threshold(field: str, kind: int) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out[field] = float(N.nvmlDeviceGetTemperatureThreshold(h, kind))

    return read


def _fans(h: Handle, out: Out) -> None:
    n = N.nvmlDeviceGetNumFans(h)
    out["fan_speed_ratios"] = [N.nvmlDeviceGetFanSpeed_v2(h, i) / 100.0 for i in range(n)]


def _power(h: Handle, out: Out) -> None:
    out["power_watts"] = N.nvmlDeviceGetPowerUsage(h) / 1000.0


def _power_limit_enforced(h: Handle, out: Out) -> None:
    out["power_limit_watts"] = N.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0


def _power_limit_management(h: Handle, out: Out) -> None:
    out["power_limit_watts"] = N.nvmlDeviceGetPowerManagementLimit(h) / 1000.0


def _power_constraints(h: Handle, out: Out) -> None:
    lo, hi = N.nvmlDeviceGetPowerManagementLimitConstraints(h)
    out["power_min_limit_watts"] = lo / 1000.0
    out["power_max_limit_watts"] = hi / 1000.0


def _power_default_limit(h: Handle, out: Out) -> None:
    out["power_default_limit_watts"] = N.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0


def _power_source(h: Handle, out: Out) -> None:
    # nvmlPowerSource_t: AC, battery, or undersized (the supply the GPU runs from is too small for it)
    out["power_supply_undersized"] = N.nvmlDeviceGetPowerSource(h) == N.NVML_POWER_SOURCE_UNDERSIZED


def _encoder(h: Handle, out: Out) -> None:
    util, _period_us = N.nvmlDeviceGetEncoderUtilization(h)
    out["encoder_utilization_ratio"] = util / 100.0


def _encoder_stats(h: Handle, out: Out) -> None:
    # one call for all sessions' count and averages; nvmlDeviceGetEncoderSessions would list them one by one
    sessions, fps, latency_us = N.nvmlDeviceGetEncoderStats(h)
    out["encoder_sessions"] = sessions
    out["encoder_average_fps"] = float(fps)
    out["encoder_average_latency_seconds"] = latency_us / 1e6


def _decoder(h: Handle, out: Out) -> None:
    util, _period_us = N.nvmlDeviceGetDecoderUtilization(h)
    out["decoder_utilization_ratio"] = util / 100.0


# nvmlDeviceGetFieldValues ids (or (id, scope id)) -> (GpuSample field, key within it or None). One call per poll
# for all of them; ids a device answers NOT_SUPPORTED are asked once.
FIELD_VALUES: dict[FieldId, tuple[str, str | None]] = {
    N.NVML_FI_DEV_MEMORY_TEMP: ("memory_temperature_celsius", None),
    N.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: ("pcie_replay_rollover_total", None),
    N.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS: ("pcie_errors_total", "correctable"),
    N.NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR: ("pcie_errors_total", "non_fatal"),
    N.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR: ("pcie_errors_total", "fatal"),
    N.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED: ("pcie_errors_total", "naks_received"),
    N.NVML_FI_DEV_PCIE_COUNT_NAKS_SENT: ("pcie_errors_total", "naks_sent"),
    N.NVML_FI_DEV_PCIE_COUNT_BAD_TLP: ("pcie_errors_total", "bad_tlp"),
    N.NVML_FI_DEV_PCIE_COUNT_BAD_DLLP: ("pcie_errors_total", "bad_dllp"),
    N.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR: ("pcie_errors_total", "lcrc"),
    N.NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR: ("pcie_errors_total", "receiver"),
    N.NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ: ("pcie_errors_total", "unsupported_request"),
    N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: ("recovery_action", None),  # nvmlDeviceGpuRecoveryAction_t
}
# "per lane error counter with scope as PCIe lane number" (NVML r550 release notes): every lane of an x16 link; the
# lanes a narrower board answers NOT_SUPPORTED for drop out after the first poll.
PCIE_MAX_LANES = 16
FIELD_VALUES.update({(N.NVML_FI_DEV_PCIE_COUNT_LANE_ERROR, lane): ("pcie_lane_errors_total", str(lane))
                     for lane in range(PCIE_MAX_LANES)})


def _temperature_margin(h: Handle, out: Out) -> None:
    # nvmlMarginTemperature_v1_t: degrees to the nearest slowdown threshold (negative past it); R565+
    out["temperature_margin_celsius"] = float(N.nvmlDeviceGetMarginTemperature(h))


def _field_values(nvlink: NvLink | None = None) -> Reader:
    """The ``FIELD_VALUES`` and ``nvlink``'s per-link ids (``NvLink.field_requests``) in one call. Each value has
    its own return code: the values a device answers NOT_SUPPORTED the first time they are asked are not asked
    again, and with none left the reading is dropped. The per-link ids join once the links are known (learning
    them can fail for a poll like any call; the device-wide values are read meanwhile)."""
    request: list[FieldId] = []
    sinks: list[Sink] = []
    call = FieldValues(request)
    fresh = 0  # the last ``fresh`` entries have not been asked yet
    started = False
    links_pending = nvlink is not None

    def read(h: Handle, out: Out) -> None:
        nonlocal request, sinks, call, fresh, started, links_pending
        if not started:
            started = True
            for fid, (field, key) in FIELD_VALUES.items():
                request.append(fid)
                sinks.append(_field_sink(field, key))
            fresh = len(request)
            call = FieldValues(request)
        if links_pending and nvlink is not None:
            try:
                extra = nvlink.field_requests(h)
            except N.NVMLError as e:
                if e.value in LOST_CODES:
                    raise
                extra = None  # the NVLink reading reports this poll's error; asked again next poll
            if extra is not None:
                links_pending = False
                request = request + [e[0] for e in extra]
                sinks = sinks + [e[1] for e in extra]
                fresh += len(extra)
                call = FieldValues(request)
        values = list(call.call(h))
        if fresh:
            first = len(request) - fresh
            keep = [i for i, (code, _) in enumerate(values) if i < first or code != N.NVML_ERROR_NOT_SUPPORTED]
            request = [request[i] for i in keep]
            sinks = [sinks[i] for i in keep]
            values = [values[i] for i in keep]
            call = FieldValues(request)
            fresh = 0
            if not request and not links_pending:
                raise N.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        for (_, number), sink in zip(values, sinks, strict=True):
            if number is not None:  # None: this value's own error (or an unknown type); the others still count
                sink(out, number)

    return read


def _field_sink(field: str, key: str | None) -> Sink:
    """Writes a device-wide value: ``out[field]`` (°C as float, counts as int), or ``out[field][key]``."""
    if key is None:
        if field.endswith("_celsius"):
            def put(out: Out, number: int | float) -> None:
                out[field] = float(number)
        else:
            def put(out: Out, number: int | float) -> None:
                out[field] = int(number)
        return put

    def put_key(out: Out, number: int | float) -> None:
        out.setdefault(field, {})[key] = int(number)

    return put_key


def _energy(h: Handle, out: Out) -> None:
    out["energy_joules"] = N.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0


CLOCK_TYPES = {"graphics": N.NVML_CLOCK_GRAPHICS, "sm": N.NVML_CLOCK_SM, "memory": N.NVML_CLOCK_MEM,
               "video": N.NVML_CLOCK_VIDEO}


def _clock(name: str, kind: int, maximum: bool) -> Reader:
    key = "max_clocks_hz" if maximum else "clocks_hz"
    fn = N.nvmlDeviceGetMaxClockInfo if maximum else N.nvmlDeviceGetClockInfo

    def read(h: Handle, out: Out) -> None:
        out.setdefault(key, {})[name] = fn(h, kind) * MHZ

    return read


def _reasons_event(h: Handle, out: Out) -> None:
    out["clocks_event_reasons"] = N.nvmlDeviceGetCurrentClocksEventReasons(h)


def _reasons_throttle(h: Handle, out: Out) -> None:
    # Before R535 only the "throttle" names exist; same bits (nvml.h).
    out["clocks_event_reasons"] = N.nvmlDeviceGetCurrentClocksThrottleReasons(h)


def _supported_event(h: Handle, out: Out) -> None:
    out["clocks_event_reasons_supported"] = N.nvmlDeviceGetSupportedClocksEventReasons(h)


def _supported_throttle(h: Handle, out: Out) -> None:
    out["clocks_event_reasons_supported"] = N.nvmlDeviceGetSupportedClocksThrottleReasons(h)


VIOLATION_POLICIES = {
    "power": N.NVML_PERF_POLICY_POWER,
    "thermal": N.NVML_PERF_POLICY_THERMAL,
    "sync_boost": N.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": N.NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": N.NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": N.NVML_PERF_POLICY_RELIABILITY,
    "total_app_clocks": N.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    "total_base_clocks": N.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
}


def _violation(name: str, policy: int) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out.setdefault("violation_seconds", {})[name] = N.nvmlDeviceGetViolationStatus(h, policy).violationTime * NS

    return read


def _ecc_mode(h: Handle, out: Out) -> None:
    cur, pending = N.nvmlDeviceGetEccMode(h)
    out["ecc_mode_current"] = bool(cur)
    out["ecc_mode_pending"] = bool(pending)


def _ecc(field: str, err: int, counter: int) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out[field] = N.nvmlDeviceGetTotalEccErrors(h, err, counter)

    return read


def _retired(field: str, cause: int) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out[field] = len(N.nvmlDeviceGetRetiredPages(h, cause))

    return read


def _retired_pending(h: Handle, out: Out) -> None:
    out["retired_pages_pending"] = bool(N.nvmlDeviceGetRetiredPagesPendingStatus(h))


def _remapped(h: Handle, out: Out) -> None:
    corr, unc, pending, failure = N.nvmlDeviceGetRemappedRows(h)
    out["remapped_rows_correctable"] = corr
    out["remapped_rows_uncorrectable"] = unc
    out["remapped_rows_pending"] = bool(pending)
    out["remapped_rows_failure"] = bool(failure)


def _simple(field: str, fn: Callable[[Handle], Any]) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out[field] = fn(h)

    return read


def _pcie_rate(field: str, counter: int) -> Reader:
    def read(h: Handle, out: Out) -> None:
        out[field] = N.nvmlDeviceGetPcieThroughput(h, counter) * PCIE_KB

    return read


def _mig(h: Handle, out: Out) -> None:
    out["mig_mode_current"] = bool(N.nvmlDeviceGetMigMode(h)[0])


# (name used in GpuSample.errors, readers best first). Names are the main GpuSample field each one fills.
def readings(peers: Callable[[], list[tuple[str, Handle]]] | None = None) -> list[tuple[str, tuple[Reader, ...]]]:
    """The optional readings of one device, in poll order; a fresh list per device (some readers hold state).
    ``peers``: the host's other GPUs as (uuid, handle), for the P2P status (None: no peer)."""
    nvlink = NvLink()  # per device: its per-link field ids join the one field-values request
    rs: list[tuple[str, tuple[Reader, ...]]] = [
        ("memory_used_bytes", (_memory_v2, _memory_v1)),
        ("utilization_gpu_ratio", (_utilization,)),
        ("pstate", (_pstate,)),
        ("temperature_celsius", (_temperature_v, _temperature_v0)),
        ("temperature_margin_celsius", (_temperature_margin,)),
        ("temperature_slowdown_celsius",
         (_threshold("temperature_slowdown_celsius", N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),)),
        ("temperature_shutdown_celsius",
         (_threshold("temperature_shutdown_celsius", N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),)),
        ("temperature_gpu_max_celsius",
         (_threshold("temperature_gpu_max_celsius", N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),)),
        ("temperature_memory_max_celsius",
         (_threshold("temperature_memory_max_celsius", N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),)),
        ("fan_speed_ratios", (_fans,)),
        ("power_watts", (_power,)),
        ("power_limit_watts", (_power_limit_enforced, _power_limit_management)),
        ("power_max_limit_watts", (_power_constraints,)),
        ("power_default_limit_watts", (_power_default_limit,)),
        ("power_supply_undersized", (_power_source,)),
        ("encoder_utilization_ratio", (_encoder,)),
        ("decoder_utilization_ratio", (_decoder,)),
        ("encoder_sessions", (_encoder_stats,)),
        ("field_values", (_field_values(nvlink),)),
        ("energy_joules", (_energy,)),
    ]
    for name, kind in CLOCK_TYPES.items():
        rs.append((f"clocks_hz.{name}", (_clock(name, kind, False),)))
        rs.append((f"max_clocks_hz.{name}", (_clock(name, kind, True),)))
    rs += [
        ("clocks_event_reasons", (_reasons_event, _reasons_throttle)),
        ("clocks_event_reasons_supported", (_supported_event, _supported_throttle)),
    ]
    for name, policy in VIOLATION_POLICIES.items():
        rs.append((f"violation_seconds.{name}", (_violation(name, policy),)))
    rs += [
        ("ecc_mode_current", (_ecc_mode,)),
        ("ecc_corrected_volatile",
         (_ecc("ecc_corrected_volatile", N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC),)),
        ("ecc_uncorrected_volatile",
         (_ecc("ecc_uncorrected_volatile", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC),)),
        ("ecc_corrected_aggregate",
         (_ecc("ecc_corrected_aggregate", N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_AGGREGATE_ECC),)),
        ("ecc_uncorrected_aggregate",
         (_ecc("ecc_uncorrected_aggregate", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC),)),
        ("retired_pages_sbe",
         (_retired("retired_pages_sbe", N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),)),
        ("retired_pages_dbe", (_retired("retired_pages_dbe", N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),)),
        ("retired_pages_pending", (_retired_pending,)),
        ("remapped_rows_uncorrectable", (_remapped,)),
        ("pcie_link_generation", (_simple("pcie_link_generation", N.nvmlDeviceGetCurrPcieLinkGeneration),)),
        ("pcie_link_max_generation",
         (_simple("pcie_link_max_generation", N.nvmlDeviceGetMaxPcieLinkGeneration),)),
        ("pcie_link_width", (_simple("pcie_link_width", N.nvmlDeviceGetCurrPcieLinkWidth),)),
        ("pcie_link_max_width", (_simple("pcie_link_max_width", N.nvmlDeviceGetMaxPcieLinkWidth),)),
        ("pcie_tx_bytes_per_second", (_pcie_rate("pcie_tx_bytes_per_second", N.NVML_PCIE_UTIL_TX_BYTES),)),
        ("pcie_rx_bytes_per_second", (_pcie_rate("pcie_rx_bytes_per_second", N.NVML_PCIE_UTIL_RX_BYTES),)),
        ("pcie_replay_total", (_simple("pcie_replay_total", N.nvmlDeviceGetPcieReplayCounter),)),
        ("nvlink_links_active", (nvlink,)),
        ("mig_mode_current", (_mig,)),
        ("fabric_state", (read_fabric,)),
        ("p2p_status", (p2p_reader(peers or (lambda: [])),)),
    ]
    return rs


# nvmlProcessInfo_v2_t (nvml.h, filled by the *_v3 and *_v2 process calls): uint pid; ull usedGpuMemory;
# uint gpuInstanceId; uint computeInstanceId -- native alignment gives 24 bytes.
_PROCESS_INFO_V2 = struct.Struct("@IQII")
# nvmlProcessInfo_v1_t (nvml.h legacy section, filled by the unversioned calls): uint pid; ull usedGpuMemory -- 16.
_PROCESS_INFO_V1 = struct.Struct("@IQ")
# The process calls best first, as (symbol suffix, struct). _v3 came with 510.39 and is missing on 470
# (nvitop#89, nvml-wrapper#46); _v2 came with MIG (R450) and is missing on 440 (pynvml#43, k8s-device-plugin#331);
# the unversioned v1 call is what those drivers have.
PROCESS_API_LEVELS: tuple[tuple[str, struct.Struct], ...] = (
    ("_v3", _PROCESS_INFO_V2),
    ("_v2", _PROCESS_INFO_V2),
    ("", _PROCESS_INFO_V1),
)
# usedGpuMemory when the driver cannot attribute memory (Windows WDDM): NVML_VALUE_NOT_AVAILABLE as unsigned.
_NOT_AVAILABLE = (1 << 64) - 1
# Initial process buffer capacity; grows to what the driver asks for (2n+5 like pynvml) and is kept.
_INITIAL_PROCESS_CAPACITY = 64


def worker_log(msg: str, level: str = "INFO") -> None:
    """One stderr line in the worker's log format (:func:`gpuwatchd.sources.nvml.protocol.log_line`), which the
    supervisor relays at ``level``; a line without this prefix (a traceback) is relayed as a WARNING."""
    sys.stderr.write(log_line(os.getpid(), level, msg))
    sys.stderr.flush()


class ProcessLister:
    """``nvmlDevice<Kind>RunningProcesses{_v3,_v2,}`` -> [(pid, used bytes or None)], one call per poll.

    pynvml's wrapper makes two calls per poll (size, then data) and turns every process into a "friendly
    object" whose attribute reads go through a Python ``__getattribute__``: at 16 GPUs x 256 processes that is
    most of a poll's CPU. This keeps a buffer per device, unpacks the structs in C (``struct.iter_unpack``), and
    only asks again when the driver answers INSUFFICIENT_SIZE. The symbol comes from pynvml's own loader.

    Older drivers lack the newer symbols (:data:`PROCESS_API_LEVELS`): until a call has worked, FUNCTION_NOT_FOUND
    moves to the next older one; with none left it is raised, and the worker learns the reading absent.
    ``on_settled`` hears of the first success on an older call and of running out of calls, so that either is
    logged once. NOT_SUPPORTED is the device's answer, which an older call would repeat, so it is raised as is.
    """

    __slots__ = ("_buf", "_cap", "_struct", "absent", "base", "confirmed", "level", "name", "on_settled", "symbol")

    def __init__(self, base: str, name: str,
                 on_settled: Callable[[ProcessLister, bool], None] | None = None) -> None:
        """``base``: the symbol without its version suffix, e.g. ``nvmlDeviceGetComputeRunningProcesses``."""
        self.base = base
        self.name = name  # key in GpuSample.errors
        self.on_settled = on_settled
        self.absent = False  # set by the worker once no level is left
        self.confirmed = False  # a call has worked: the level is settled for the life of the worker
        self.level = 0  # index into PROCESS_API_LEVELS
        self.symbol = base + PROCESS_API_LEVELS[0][0]
        self._struct = PROCESS_API_LEVELS[0][1]
        self._cap = _INITIAL_PROCESS_CAPACITY
        self._buf: ctypes.Array[ctypes.c_char] = ctypes.create_string_buffer(self._cap * self._struct.size)

    def _use(self, level: int) -> None:
        self.level = level
        self.symbol = self.base + PROCESS_API_LEVELS[level][0]
        self._struct = PROCESS_API_LEVELS[level][1]
        self._buf = ctypes.create_string_buffer(self._cap * self._struct.size)

    def __call__(self, handle: Handle) -> list[tuple[int, int | None]]:
        while True:
            try:
                result = self._call(handle)
            except N.NVMLError as e:
                if e.value != N.NVML_ERROR_FUNCTION_NOT_FOUND or self.confirmed:
                    raise
                if self.level + 1 >= len(PROCESS_API_LEVELS):
                    if self.on_settled is not None:
                        self.on_settled(self, False)
                    raise
                self._use(self.level + 1)
                continue
            if not self.confirmed:
                self.confirmed = True
                if self.level and self.on_settled is not None:
                    self.on_settled(self, True)
            return result

    def _call(self, handle: Handle) -> list[tuple[int, int | None]]:
        fn = N._nvmlGetFunctionPointer(self.symbol)
        size = self._struct.size
        count = ctypes.c_uint(self._cap)
        ret = fn(handle, ctypes.byref(count), self._buf)
        if ret == N.NVML_ERROR_INSUFFICIENT_SIZE:
            self._cap = count.value * 2 + 5
            self._buf = ctypes.create_string_buffer(self._cap * size)
            count = ctypes.c_uint(self._cap)
            ret = fn(handle, ctypes.byref(count), self._buf)
        if ret != N.NVML_SUCCESS:
            raise N.NVMLError(ret)
        raw = ctypes.string_at(self._buf, min(count.value, self._cap) * size)
        return [(t[0], None if t[1] == _NOT_AVAILABLE else t[1]) for t in self._struct.iter_unpack(raw)]


# Readings of what a board is, not what it does: constant while the driver has the device open (the VBIOS's
# temperature thresholds, the power limits' bounds and default, the maximum clocks, the clock-event reasons the board
# supports, the PCIe link it is capable of). Each is read when the device is opened and every
# STATIC_REFRESH_SECONDS after (``static_refresh_seconds``, a worker option), its last values given in between:
# 13 of the ~49 calls a GPU costs each poll (docs/performance.md, "8x32"). A fresh worker (re-enumeration,
# reconfiguration, a restart) reads them afresh. What an administrator sets (the enforced power limit, ECC mode,
# application clocks) is not here: it is read every poll.
STATIC_READINGS = frozenset({
    "temperature_slowdown_celsius",
    "temperature_shutdown_celsius",
    "temperature_gpu_max_celsius",
    "temperature_memory_max_celsius",
    "power_max_limit_watts",  # nvmlDeviceGetPowerManagementLimitConstraints: the settable limit's bounds
    "power_default_limit_watts",
    "max_clocks_hz.graphics",
    "max_clocks_hz.sm",
    "max_clocks_hz.memory",
    "max_clocks_hz.video",
    "clocks_event_reasons_supported",
    "pcie_link_max_generation",
    "pcie_link_max_width",
    "p2p_status",  # one call per pair and capability (8 GPUs: 168): a topology fact, re-read with the others
})
STATIC_REFRESH_SECONDS = 60.0


class _Slot:
    __slots__ = ("confirmed", "impls", "index", "kept", "kept_at", "name", "static")

    def __init__(self, name: str, impls: tuple[Reader, ...]) -> None:
        self.name = name
        self.impls = impls
        self.index = 0
        self.confirmed = False  # has worked at least once on this device
        self.static = name in STATIC_READINGS
        self.kept: Out | None = None  # a static reading's last values (what its reader wrote), while fresh
        self.kept_at = 0.0  # time.monotonic() they were read


def _merge(out: Out, values: Out) -> None:
    """Put a reading's values into ``out`` as its reader would have (the clocks' dicts are shared by four)."""
    for key, value in values.items():
        if type(value) is dict:
            out.setdefault(key, {}).update(value)
        else:
            out[key] = value


class DeviceReadings:
    """The readings of one device and what has been learned about them (the capability cache)."""

    def __init__(self, handle: Handle, only: frozenset[str] | None = None,
                 static_refresh: float = STATIC_REFRESH_SECONDS,
                 peers: Callable[[], list[tuple[str, Handle]]] | None = None) -> None:
        """``only``: the names of the readings to take (a MIG device: sources/nvml/worker/mig.py); None: all.
        ``static_refresh``: seconds a :data:`STATIC_READINGS` value is given again before it is read again."""
        self.handle = handle
        self.static_refresh = static_refresh
        self._slots = [_Slot(n, i) for n, i in readings(peers) if only is None or n in only]
        self.absent: list[str] = []  # names learned absent, in the order learned (logged once)
        self.fallbacks: dict[str, int] = {}  # name -> index of the fallback in use (0 = preferred)
        self.process_listers = (
            ProcessLister("nvmlDeviceGetComputeRunningProcesses", "processes.compute", self._process_api_settled),
            ProcessLister("nvmlDeviceGetGraphicsRunningProcesses", "processes.graphics", self._process_api_settled),
        )
        self._process_api_logged: set[int] = set()  # levels logged (-1: none left); both lists normally agree
        self.process_util = ProcessUtilization(self._process_util_settled)
        self.gpm = GpmReading(handle)  # holds NVML sample buffers: close() frees them

    def _process_util_settled(self, level: int, ok: bool) -> None:
        """Log, once per device, that per-process utilization comes from the older call; learn it absent quietly
        like any other reading (most drivers' MIG mode, older boards)."""
        if not ok:
            self.absent.append("processes.utilization")
            return
        self.fallbacks["processes.utilization"] = level
        try:
            gpu = N.nvmlDeviceGetUUID(self.handle)
        except N.NVMLError:
            gpu = "?"
        worker_log(f"GPU {gpu}: per-process utilization via {PROCESS_UTIL_CALLS[level]} "
                   f"(this driver has no {PROCESS_UTIL_CALLS[0]})")

    def _process_api_settled(self, lister: ProcessLister, ok: bool) -> None:
        """Log, once per device, the older process call in use, or that the driver has none."""
        level = lister.level if ok else -1
        if ok:
            self.fallbacks[lister.name] = level
        if level in self._process_api_logged:
            return
        self._process_api_logged.add(level)
        try:
            gpu = N.nvmlDeviceGetUUID(self.handle)  # once per device: not worth keeping the UUID around
        except N.NVMLError:
            gpu = "?"
        if ok:
            api = PROCESS_API_LEVELS[level][0].lstrip("_") or "v1 (unversioned)"
            worker_log(f"GPU {gpu}: process lists via the NVML {api} calls ({lister.symbol}); "
                       "this driver has no *RunningProcesses_v3")
        else:
            worker_log(f"GPU {gpu}: no NVML process-list call in this driver (not even the unversioned one); "
                       "processes are not reported", "WARNING")

    def poll(self, out: Out, errors: dict[str, str]) -> None:
        """Fill ``out`` with every supported reading; per-poll failures go to ``errors``.

        Raises NvmlGpuLost when the device answers GPU_IS_LOST / RESET_REQUIRED.
        """
        h = self.handle
        dropped = False
        now = time.monotonic()
        for slot in self._slots:
            if slot.static:
                kept = slot.kept
                if kept is not None and now - slot.kept_at < self.static_refresh:
                    _merge(out, kept)
                    continue
                slot.kept = None
            while True:
                try:
                    if slot.static:
                        kept = {}
                        slot.impls[slot.index](h, kept)
                        _merge(out, kept)
                        slot.kept, slot.kept_at = kept, now
                    else:
                        slot.impls[slot.index](h, out)
                except N.NVMLError as e:
                    code = e.value
                    if code in ABSENT_CODES and not slot.confirmed:
                        if slot.index + 1 < len(slot.impls):
                            slot.index += 1
                            self.fallbacks[slot.name] = slot.index
                            continue
                        slot.index = -1
                        dropped = True
                        self.absent.append(slot.name)
                    elif code in LOST_CODES:
                        raise NvmlGpuLost(code, slot.name) from None
                    else:
                        errors[slot.name] = reason(code)
                else:
                    slot.confirmed = True
                break
        if dropped:
            self._slots = [s for s in self._slots if s.index >= 0]
        self.gpm.poll(out, errors)

    def close(self) -> None:
        """Free what the driver holds for this device's readings (GPM sample buffers)."""
        self.gpm.close()
