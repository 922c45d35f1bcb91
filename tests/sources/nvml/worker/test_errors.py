"""The typed NVML error vocabulary."""

from __future__ import annotations

import pytest

from gpuwatchd.sources.nvml.worker.errors import NvmlAbsent, NvmlFailure, NvmlGpuLost, classify, reason


@pytest.mark.parametrize(
    ("code", "kind", "text"),
    [(3, NvmlAbsent, "not_supported"), (13, NvmlAbsent, "function_not_found"),
     (25, NvmlAbsent, "argument_version_mismatch"), (15, NvmlGpuLost, "gpu_is_lost"),
     (16, NvmlGpuLost, "reset_required"), (999, NvmlFailure, "unknown"), (4, NvmlFailure, "no_permission")],
)
def test_classify(code: int, kind: type[NvmlFailure], text: str) -> None:
    err = classify(code, "nvmlDeviceGetPowerUsage")
    assert type(err) is kind
    assert (err.code, err.reason, err.call) == (code, text, "nvmlDeviceGetPowerUsage")
    assert str(err) == f"nvmlDeviceGetPowerUsage: {text} ({code})"


def test_codes_from_a_newer_driver_keep_their_number() -> None:
    assert reason(77) == "code_77"
    assert reason(12) == "library_not_found" and reason(9) == "driver_not_loaded"
