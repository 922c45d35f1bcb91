"""The stand-in's MIG device handles (standin_mig.c), as nvml.h declares the calls, through the real pynvml."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from mig_states import GIB, a100

from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Sim

def test_enumeration_identity_and_parent(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[a100(), make_device(1)]))
    n.nvmlInit()
    gpu, plain = sim.handles()
    assert n.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    assert n.nvmlDeviceGetMaxMigDeviceCount(plain) == 0  # nvml.h: zero if MIG is not supported or enabled
    m0 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    with pytest.raises(n.NVMLError_NotFound):  # an empty slot
        n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    m2 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    with pytest.raises(n.NVMLError_InvalidArgument):  # past the last slot
        n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7)
    with pytest.raises(n.NVMLError_NotSupported):  # a GPU without MIG
        n.nvmlDeviceGetMigDeviceHandleByIndex(plain, 0)
    assert bool(n.nvmlDeviceIsMigDeviceHandle(m0)) and not bool(n.nvmlDeviceIsMigDeviceHandle(gpu))
    assert n.nvmlDeviceGetUUID(m2) == "MIG-aaaaaaaa-0000-5000-8000-000000000002"
    assert n.nvmlDeviceGetName(m2) == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert (n.nvmlDeviceGetGpuInstanceId(m0), n.nvmlDeviceGetComputeInstanceId(m0)) == (2, 0)
    assert n.nvmlDeviceGetGpuInstanceId(m2) == 9
    assert n.nvmlDeviceGetIndex(m2) == 2  # nvml.h: a MIG handle's index is its MIG device index
    with pytest.raises(n.NVMLError_NotSupported):  # questions about a MIG device, asked of a GPU
        n.nvmlDeviceGetGpuInstanceId(gpu)
    parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m2)
    assert n.nvmlDeviceGetUUID(parent) == n.nvmlDeviceGetUUID(gpu)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu)
    with pytest.raises(n.NVMLError_InvalidArgument):  # takes the parent GPU's handle
        n.nvmlDeviceGetMigDeviceHandleByIndex(m0, 0)


def test_memory_and_processes_per_instance(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[a100()]))
    n.nvmlInit()
    (gpu,) = sim.handles()
    m0 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    m2 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    mem = n.nvmlDeviceGetMemoryInfo(m0, version=n.nvmlMemory_v2)
    assert (mem.total, mem.used, mem.free) == (40 * GIB, 20 * GIB, 20 * GIB)
    assert n.nvmlDeviceGetMemoryInfo(m2).total == 10 * GIB
    procs = n.nvmlDeviceGetComputeRunningProcesses(m2)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
        (4343, 4 * GIB, 9, 0), (4344, None, 9, 0)]
    # The GPU's list is the aggregate (nvml.h): its own processes, then every instance's with their ids.
    agg = n.nvmlDeviceGetComputeRunningProcesses(gpu)
    assert [(p.pid, p.gpuInstanceId) for p in agg] == [(77, 0xFFFFFFFF), (4242, 2), (4343, 9), (4344, 9)]
    with pytest.raises(n.NVMLError_NotSupported):  # no graphics list in the state: MIG has no graphics contexts
        n.nvmlDeviceGetGraphicsRunningProcesses(m0)


def test_physical_readings_are_not_supported_on_a_mig_handle(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[a100()]))
    n.nvmlInit()
    (gpu,) = sim.handles()
    m0 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    for call in (n.nvmlDeviceGetPowerUsage, n.nvmlDeviceGetTemperatureV, n.nvmlDeviceGetEnforcedPowerLimit,
                 n.nvmlDeviceGetPciInfo, n.nvmlDeviceGetSerial, n.nvmlDeviceGetUtilizationRates,
                 n.nvmlDeviceGetMigMode, n.nvmlDeviceGetSupportedEventTypes, n.nvmlDeviceGetPcieReplayCounter):
        with pytest.raises(n.NVMLError_NotSupported):
            call(m0) if call is not n.nvmlDeviceGetTemperatureV else call(m0, n.NVML_TEMPERATURE_GPU)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetClockInfo(m0, n.NVML_CLOCK_SM)
    assert n.nvmlDeviceGetPowerUsage(gpu) == 25000  # the parent keeps its physical readings


def test_lost_gpu_destroyed_instance_and_overrides(sim: Sim) -> None:
    n = sim.nvml
    dev = a100()
    dev["mig_devices"][1]["errors"] = {"nvmlDeviceGetMemoryInfo_v2": "UNKNOWN"}
    sim.update(make_state(0, devices=[dev]))
    n.nvmlInit()
    (gpu,) = sim.handles()
    m0 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    m2 = n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    with pytest.raises(n.NVMLError_Unknown):
        n.nvmlDeviceGetMemoryInfo(m2, version=n.nvmlMemory_v2)
    assert n.nvmlDeviceGetMemoryInfo(m2).total == 10 * GIB  # the override names one call
    # The instance at index 0 is destroyed: its handle is invalid (nvml.h) until requested again.
    sim.update(make_state(0, devices=[{**dev, "mig_devices": dev["mig_devices"][1:]}]))
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetUUID(m0)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    sim.update(make_state(0, devices=[{**dev, "lost": True}]))
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetUUID(m2)
    sim.update(make_state(0, devices=[{**dev, "mig_mode": [0, 0], "mig_devices": []}]))
    assert n.nvmlDeviceGetMaxMigDeviceCount(gpu) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mig_mode": [0, 0]}, r"devices\[0\]\.mig_devices: MIG devices need MIG mode on"),
        ({"mig_max_devices": 2}, r"mig_devices\[1\]\.index: 2 is not below mig_max_devices"),
        ({"mig_max_devices": 17}, r"devices\[0\]\.mig_max_devices: 17 is outside 0\.\.16"),
    ],
)
def test_state_validation(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_state(tmp_path / "s", make_state(0, devices=[a100(**change)]))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("uuid", "GPU-123", r"mig_devices\[0\]\.uuid: expected MIG-"),
        ("profile", "big one", r"mig_devices\[0\]\.profile: expected a MIG profile name"),
        ("index", 2, r"mig_devices\[1\]\.index: duplicate of devices\[0\]\.mig_devices\[0\]\.index \(2\)"),
        ("gpu_instance_id", 9, r"mig_devices\[1\]: same gpu/compute instance ids as devices\[0\]\.mig_devices\[0\]"),
        ("colour", 1, r"mig_devices\[0\]\.colour: unknown key"),
    ],
)
def test_mig_device_validation(tmp_path: Path, key: str, value: Any, message: str) -> None:
    dev = a100()
    dev["mig_devices"][0][key] = value
    with pytest.raises(ValueError, match=message):
        write_state(tmp_path / "s", make_state(0, devices=[dev]))
