"""The stand-in's older process calls (_v2 and the unversioned v1), through the real pynvml and at the ABI."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.state import make_device, make_state

if TYPE_CHECKING:
    from conftest import Sim

BIG = 85 * (1 << 30)  # above 2^32: a 32-bit read or a misplaced field cannot pass
PROCS = {
    "compute": [{"pid": 4242, "used_memory": BIG}, {"pid": 77, "used_memory": 2048}],
    "graphics": [{"pid": 1001, "used_memory": None}, {"pid": 4242, "used_memory": BIG}],
}


class ProcessInfoV1(ctypes.Structure):
    """nvml.h nvmlProcessInfo_v1_t (pynvml has no class for it: its unversioned wrapper calls _v3)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


@pytest.fixture
def dev(sim: Sim) -> Any:
    sim.update(make_state(0, devices=[make_device(0, processes=PROCS), make_device(1)]))
    sim.nvml.nvmlInit()
    return sim.nvml.nvmlDeviceGetHandleByIndex(0)


def test_v2_calls_through_pynvml(sim: Sim, dev: Any) -> None:
    n = sim.nvml
    compute = n.nvmlDeviceGetComputeRunningProcesses_v2(dev)
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [(4242, BIG), (77, 2048)]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in compute} == {(0xFFFFFFFF, 0xFFFFFFFF)}
    graphics = n.nvmlDeviceGetGraphicsRunningProcesses_v2(dev)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(1001, None), (4242, BIG)]
    assert n.nvmlDeviceGetComputeRunningProcesses_v2(n.nvmlDeviceGetHandleByIndex(1)) == []


@pytest.mark.parametrize("kind", ["Compute", "Graphics"])
def test_v1_two_pass_protocol_and_16_byte_stride(sim: Sim, dev: Any, kind: str) -> None:
    assert ctypes.sizeof(ProcessInfoV1) == 16
    fn = getattr(sim.lib, f"nvmlDeviceGet{kind}RunningProcesses")
    count = ctypes.c_uint(0)
    assert fn(dev, ctypes.byref(count), None) == 7  # INSUFFICIENT_SIZE with the required count
    assert count.value == 2
    # One spare slot past the answer, filled with a marker: the stand-in must write exactly two 16-byte records.
    buf = (ProcessInfoV1 * 3)()
    buf[2].pid, buf[2].usedGpuMemory = 0xDEAD, 0xBEEF
    count.value = 3
    assert fn(dev, ctypes.byref(count), buf) == 0
    want = PROCS[kind.lower()]
    got = [(buf[i].pid, buf[i].usedGpuMemory) for i in range(count.value)]
    na = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE
    assert got == [(p["pid"], na if p["used_memory"] is None else p["used_memory"]) for p in want]
    assert (buf[2].pid, buf[2].usedGpuMemory) == (0xDEAD, 0xBEEF)


@pytest.mark.parametrize("symbol", ["nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"])
def test_older_calls_have_their_own_overrides(sim: Sim, symbol: str) -> None:
    broken = make_device(0, processes=PROCS, errors={symbol: "NO_PERMISSION"})
    sim.update(make_state(0, devices=[broken]))
    sim.nvml.nvmlInit()
    h = sim.nvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    assert getattr(sim.lib, symbol)(h, ctypes.byref(count), None) == 4  # NO_PERMISSION
    # the other versions are unaffected
    assert [p.pid for p in sim.nvml.nvmlDeviceGetComputeRunningProcesses_v3(h)] == [4242, 77]
