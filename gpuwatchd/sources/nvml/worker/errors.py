"""NVML return codes mapped once, at the boundary, to a small typed vocabulary (leptonai/gpud style).

The worker turns every ``pynvml.NVMLError`` into an :class:`NvmlFailure` subclass here, so nothing past the
boundary compares integers or parses display strings. Codes are NVIDIA's ``nvmlReturn_t`` values (nvml.h
l.1520-1553, identical in pynvml l.223-254); this module does not import pynvml, so the daemon can use it.
"""

from __future__ import annotations

# nvmlReturn_t values (nvml.h). Only the ones a decision depends on are named.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
GPU_NOT_FOUND = 28
UNKNOWN = 999

# code -> short snake_case reason (the ``nvml_error`` / ``errors`` vocabulary exported as label values).
REASONS: dict[int, str] = {
    1: "uninitialized",
    2: "invalid_argument",
    NOT_SUPPORTED: "not_supported",
    NO_PERMISSION: "no_permission",
    5: "already_initialized",
    6: "not_found",
    7: "insufficient_size",
    8: "insufficient_power",
    DRIVER_NOT_LOADED: "driver_not_loaded",
    TIMEOUT: "timeout",
    11: "irq_issue",
    LIBRARY_NOT_FOUND: "library_not_found",
    FUNCTION_NOT_FOUND: "function_not_found",
    14: "corrupted_inforom",
    GPU_IS_LOST: "gpu_is_lost",
    RESET_REQUIRED: "reset_required",
    17: "operating_system",
    LIB_RM_VERSION_MISMATCH: "lib_rm_version_mismatch",
    19: "in_use",
    20: "memory",
    21: "no_data",
    22: "vgpu_ecc_not_supported",
    23: "insufficient_resources",
    24: "freq_not_supported",
    ARGUMENT_VERSION_MISMATCH: "argument_version_mismatch",
    26: "deprecated",
    27: "not_ready",
    GPU_NOT_FOUND: "gpu_not_found",
    29: "invalid_state",
    30: "reset_type_not_supported",
    UNKNOWN: "unknown",
}

# "This reading does not exist here": learned once per device, never retried in the same worker. A missing
# symbol (older driver) and a struct version the driver refuses are the same fact as NOT_SUPPORTED for us.
ABSENT_CODES = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
# The device is unusable until a fresh enumeration (fell off the bus, or needs a reset): nvml.h lists
# GPU_IS_LOST on every per-device call; RESET_REQUIRED means the same to a monitor (gpud maps both to "lost").
LOST_CODES = frozenset({GPU_IS_LOST, RESET_REQUIRED})


def reason(code: int) -> str:
    """Short snake_case reason for an NVML return code; codes newer than this table read ``code_<n>``."""
    return REASONS.get(code, f"code_{code}")


class NvmlFailure(Exception):
    """An NVML call failed; ``code`` is the nvmlReturn_t, ``reason`` its snake_case name."""

    def __init__(self, code: int, call: str = "") -> None:
        self.code = code
        self.reason = reason(code)
        self.call = call
        super().__init__(f"{call}: {self.reason} ({code})" if call else f"{self.reason} ({code})")


class NvmlAbsent(NvmlFailure):
    """The reading is not supported by this GPU or driver (cached as absent)."""


class NvmlGpuLost(NvmlFailure):
    """The GPU answers GPU_IS_LOST / RESET_REQUIRED: stop polling it; a fresh worker re-enumerates."""


def classify(code: int, call: str = "") -> NvmlFailure:
    """The typed failure for an NVML return code."""
    if code in ABSENT_CODES:
        return NvmlAbsent(code, call)
    if code in LOST_CODES:
        return NvmlGpuLost(code, call)
    return NvmlFailure(code, call)
