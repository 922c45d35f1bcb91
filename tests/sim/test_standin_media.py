"""The stand-in's encoder/decoder utilization calls, as nvml.h declares them, through the real pynvml."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Sim


def test_utilization_and_sampling_period(sim: Sim) -> None:
    n = sim.nvml
    devices = [make_device(0, encoder_utilization=12, decoder_utilization=100), make_device(1)]
    sim.update(make_state(0, devices=devices))
    n.nvmlInit()
    a, b = sim.handles()
    assert n.nvmlDeviceGetEncoderUtilization(a) == [12, 166667]
    assert n.nvmlDeviceGetDecoderUtilization(a) == [100, 166667]
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetEncoderUtilization(b)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetDecoderUtilization(b)


def test_error_override(sim: Sim) -> None:
    n = sim.nvml
    dev = make_device(0, encoder_utilization=1, errors={"nvmlDeviceGetDecoderUtilization": "GPU_IS_LOST"})
    sim.update(make_state(0, devices=[dev]))
    n.nvmlInit()
    (a,) = sim.handles()
    assert n.nvmlDeviceGetEncoderUtilization(a)[0] == 1
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetDecoderUtilization(a)


def test_out_of_range_percent_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"devices\[0\]\.encoder_utilization"):
        write_state(tmp_path / "s", make_state(0, devices=[make_device(0, encoder_utilization=101)]))


def test_field_values_answer_per_value(sim: Sim) -> None:
    n = sim.nvml
    dev = make_device(0, field_values={"memory_temp": 61, "pcie_correctable_errors": 2**40})
    sim.update(make_state(0, devices=[dev]))
    n.nvmlInit()
    (a,) = sim.handles()
    ids = [n.NVML_FI_DEV_MEMORY_TEMP, n.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
           n.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR, n.NVML_FI_DEV_ECC_CURRENT]
    temp, correctable, fatal, unknown = n.nvmlDeviceGetFieldValues(a, ids)
    assert (temp.nvmlReturn, temp.valueType, temp.value.uiVal) == (n.NVML_SUCCESS, n.NVML_VALUE_TYPE_UNSIGNED_INT, 61)
    assert (correctable.nvmlReturn, correctable.valueType, correctable.value.ullVal) == (
        n.NVML_SUCCESS, n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**40)
    assert correctable.timestamp > 0
    assert fatal.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED  # unset in the state
    assert unknown.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED  # an id the stand-in does not serve


def test_encoder_stats(sim: Sim) -> None:
    n = sim.nvml
    stats = {"session_count": 2, "average_fps": 30, "average_latency_us": 700}
    sim.update(make_state(0, devices=[make_device(0, encoder_stats=stats), make_device(1)]))
    n.nvmlInit()
    a, b = sim.handles()
    assert n.nvmlDeviceGetEncoderStats(a) == (2, 30, 700)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetEncoderStats(b)


def test_encoder_stats_are_all_or_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"devices\[0\]\.encoder_stats"):
        write_state(tmp_path / "s", make_state(0, devices=[make_device(0, encoder_stats={"session_count": 1})]))
