"""The stand-in's per-process utilization calls (standin_procutil.c), as nvml.h declares them, through the real
pynvml: samples newer than lastSeenTimeStamp, NOT_FOUND without any, INSUFFICIENT_SIZE, the struct version."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from conftest import Sim

T0 = 1_700_000_000_000_000  # us


def _samples() -> list[dict[str, int]]:
    return [
        {"pid": 4242, "timestamp_us": T0, "sm": 10, "memory": 5, "encoder": 0, "decoder": 0},
        {"pid": 4242, "timestamp_us": T0 + 1_000_000, "sm": 91, "memory": 40, "encoder": 3, "decoder": 4,
         "jpeg": 6, "ofa": 7},
        {"pid": 5151, "timestamp_us": T0 + 500_000, "sm": 20, "memory": 2, "encoder": 50, "decoder": 60},
    ]


def _state() -> dict[str, object]:
    return make_state(0, devices=[make_device(0, process_utilization=_samples()), make_device(1),
                                  make_device(2, process_utilization=[])])


def test_versioned_call_returns_samples_newer_than_last_seen(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_state())
    n.nvmlInit()
    a, b, c = sim.handles()
    rows = n.nvmlDeviceGetProcessesUtilizationInfo(a, 0)
    assert [(r.pid, r.timeStamp, r.smUtil, r.memUtil, r.encUtil, r.decUtil, r.jpgUtil, r.ofaUtil) for r in rows] == [
        (4242, T0, 10, 5, 0, 0, 0, 0), (4242, T0 + 1_000_000, 91, 40, 3, 4, 6, 7),
        (5151, T0 + 500_000, 20, 2, 50, 60, 0, 0)]
    rows = n.nvmlDeviceGetProcessesUtilizationInfo(a, T0 + 500_000)  # strictly greater than lastSeenTimeStamp
    assert [(r.pid, r.smUtil) for r in rows] == [(4242, 91)]
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetProcessesUtilizationInfo(a, T0 + 1_000_000)
    with pytest.raises(n.NVMLError_NotSupported):  # no samples in the state: the device lacks the feature
        n.nvmlDeviceGetProcessesUtilizationInfo(b, 0)
    with pytest.raises(n.NVMLError_NotFound):  # supported, but nothing sampled
        n.nvmlDeviceGetProcessesUtilizationInfo(c, 0)


def test_older_call_returns_the_same_samples(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_state())
    n.nvmlInit()
    a, b, _ = sim.handles()
    rows = n.nvmlDeviceGetProcessUtilization(a, T0)
    assert [(r.pid, r.timeStamp, r.smUtil, r.memUtil, r.encUtil, r.decUtil) for r in rows] == [
        (4242, T0 + 1_000_000, 91, 40, 3, 4), (5151, T0 + 500_000, 20, 2, 50, 60)]
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetProcessUtilization(a, T0 + 2_000_000)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetProcessUtilization(b, 0)


def test_buffer_size_and_struct_version_are_checked(sim: Sim) -> None:
    n = sim.nvml
    sim.update(_state())
    n.nvmlInit()
    a = sim.handles()[0]
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetProcessesUtilizationInfo")
    info = n.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = n.ProcessesUtilizationInfo_v1
    info.processSamplesCount = 1
    arr = (n.c_nvmlProcessUtilizationInfo_v1_t * 1)()
    info.procUtilArray = arr
    assert fn(a, ctypes.byref(info)) == n.NVML_ERROR_INSUFFICIENT_SIZE
    assert info.processSamplesCount == 3  # what the caller must make room for
    info.version = n.ProcessesUtilizationInfo_v1 + 1  # a struct version this driver does not know
    assert fn(a, ctypes.byref(info)) == n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    old = n._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    count = ctypes.c_uint(0)
    assert old(a, None, ctypes.byref(count), ctypes.c_ulonglong(T0)) == n.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2


def test_error_override(sim: Sim) -> None:
    n = sim.nvml
    dev = make_device(0, process_utilization=_samples(), errors={"nvmlDeviceGetProcessUtilization": "GPU_IS_LOST"})
    sim.update(make_state(0, devices=[dev]))
    n.nvmlInit()
    (a,) = sim.handles()
    assert len(n.nvmlDeviceGetProcessesUtilizationInfo(a, 0)) == 3
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetProcessUtilization(a, 0)


def test_out_of_range_sample_is_refused(tmp_path: Path) -> None:
    bad = make_device(0, process_utilization=[{"pid": 1, "timestamp_us": 5, "sm": 101}])
    with pytest.raises(ValueError, match=r"devices\[0\]\.process_utilization\[0\]\.sm"):
        write_state(tmp_path / "s", make_state(0, devices=[bad]))
