"""What the stand-in driver (``standin.c``) exports and understands: symbol names, NVML return codes, event bits.

Kept apart from the state writer so the tables can be checked against the C source and pynvml in one place
(tests/sim/test_standin_state.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

# The environment variable naming the state file; nvmlInit reads it (standin.c, docs/sim-state.md).
STATE_ENV = "GPUWATCHD_SIM_STATE"

# standin.c MAX_DEVICES: enumeration slots; a large HGX node has 8-16 GPUs, "fleet" scenarios stay far below.
MAX_DEVICES = 1024
# GPUs one simulation plays (scenario `gpus`, `sim --gpus`, `sim --from-xml`): 16x a large HGX node, and every
# simulated GPU is a set of NVML calls per poll in the one worker, so far more would only show an overloaded sim.
MAX_SIM_GPUS = 256

# nvml.h nvmlReturn_t (l.1520-1553), names without the NVML_ERROR_ prefix.
ERROR_CODES: dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "VGPU_ECC_NOT_SUPPORTED": 22,
    "INSUFFICIENT_RESOURCES": 23,
    "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "RESET_TYPE_NOT_SUPPORTED": 30,
    "UNKNOWN": 999,
}

# nvml.h nvmlEventType* bits (l.3405-3461) for the event "type" names of docs/sim-state.md.
EVENT_TYPES: dict[str, int] = {"sbe": 0x1, "dbe": 0x2, "pstate": 0x4, "xid": 0x8, "clock": 0x10, "power_source": 0x80}

class Reading(NamedTuple):
    """One row of ``standin_readings.def``: a getter answering one integer of the device's state."""

    symbol: str  # the NVML call, e.g. nvmlDeviceGetPowerUsage
    c_type: str  # its out type in nvml.h: unsigned int, unsigned long long, or an enum / typedef of them
    key: str  # the device's state key (and its state-file line)
    lo: int
    hi: int


READINGS_TABLE = Path(__file__).with_name("standin_readings.def")
_LIMITS = {"UINT_MAX": 2**32 - 1, "LLONG_MAX": 2**63 - 1}
_BOUND = r"(-?\d+|UINT_MAX|LLONG_MAX)"
# READING(...) with an optional trailing /* comment */
_ROW = re.compile(rf"READING\((\w+), (\w+(?: \w+)*), (\w+), {_BOUND}, {_BOUND}\)(?: */\*.*\*/)?")


def _bound(text: str) -> int:
    return _LIMITS[text] if text in _LIMITS else int(text)


def load_readings(path: Path = READINGS_TABLE) -> tuple[Reading, ...]:
    """The rows of the simple-readings table in order; ValueError for a row that does not parse, or for rows
    that share a state key with different ranges."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("READING("):
            continue
        m = _ROW.fullmatch(line.strip())
        if m is None:
            raise ValueError(f"{path.name}:{n}: expected READING(symbol, out type, state key, min, max), got {line!r}")
        rows.append(Reading(m[1], m[2], m[3], _bound(m[4]), _bound(m[5])))
    first: dict[str, Reading] = {}
    for r in rows:
        f = first.setdefault(r.key, r)
        if (f.lo, f.hi) != (r.lo, r.hi):
            raise ValueError(f"{path.name}: {r.symbol} and {f.symbol} serve {r.key} with different ranges")
    return tuple(rows)


# The stand-in's simple readings (standin_readings.def, which the C side includes too).
READINGS: tuple[Reading, ...] = load_readings()
# Their state keys with the range each may hold (rows sharing a key are older names of one call).
READING_KEYS: dict[str, tuple[int, int]] = {r.key: (r.lo, r.hi) for r in READINGS}

# Per-device symbols whose return code / delay a state can override (the C side's FUNCS list and the simple
# readings).
OVERRIDABLE_SYMBOLS: frozenset[str] = frozenset(r.symbol for r in READINGS) | frozenset(
    [
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetPowerState",
        "nvmlDeviceGetNumFans",
        "nvmlDeviceGetFanSpeed_v2",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetMemoryErrorCounter",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPages_v2",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        # Older drivers' process calls (nvml.h legacy section): _v2 where _v3 is missing (before 510.39, nvitop#89), the
        # unversioned v1 where _v2 is too (before R450, pynvml#43).
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        # Media engines (nvml.h): encoder / decoder utilization, percent over a sampling period
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetEncoderStats",
        # Thermal margin (nvml.h nvmlMarginTemperature_v1_t, R565+): degrees to the nearest slowdown threshold
        "nvmlDeviceGetMarginTemperature",
        # Field values (nvml.h NVML_FI_*): memory temperature, PCIe error counters (incl. per lane)
        "nvmlDeviceGetFieldValues",
        # Per-process utilization (nvml.h): the versioned call (R550+) and the older sample-buffer call
        "nvmlDeviceGetProcessesUtilizationInfo",
        "nvmlDeviceGetProcessUtilization",
        # GPM (nvml.h "GPM Functions", Hopper and newer): support, device and MIG-instance samples, metrics
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleGet",
        "nvmlGpmMigSampleGet",
        "nvmlGpmMetricsGet",
        # MIG devices (nvml.h Multi Instance GPU Management; standin_mig.c)
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        # The GPU's CUDA compute capability (which torch builds have kernels for it: gpuwatchd doctor)
        "nvmlDeviceGetCudaComputeCapability",
        # GPU fabric (nvml.h nvmlGpuFabricInfo_v2_t/_v3_t, Hopper and newer) and P2P status per pair (standin_fabric.c)
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetP2PStatus",
    ]
)
# Everything the stand-in exports (and so everything build_standin(omit=...) may leave out).
STANDIN_SYMBOLS: frozenset[str] = OVERRIDABLE_SYMBOLS | frozenset(
    [
        "nvmlInitWithFlags",
        "nvmlInit_v2",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlDeviceGetCount_v2",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlEventSetCreate",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
    ]
)
