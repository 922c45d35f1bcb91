"""Every call the daemon uses returns what the state says, through the real pynvml (in-process)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.state import bus_id, make_device, make_state

if TYPE_CHECKING:
    from conftest import Sim

RICH = make_device(
    0,
    uuid="GPU-11111111-2222-4333-8444-555555555555",
    name="NVIDIA H100 80GB HBM3",
    serial="1654922006536",
    minor_number=3,
    pci={"domain": 1, "bus": 0x19, "device": 2, "pci_device_id": 0x233010DE, "pci_subsystem_id": 0x16C110DE},
    memory={"total": 85520809984, "reserved": 570949632, "used": 4294967296},
    utilization={"gpu": 37, "memory": 12},
    temperature=54,
    temperature_thresholds={"shutdown": 92, "slowdown": 89, "mem_max": 95, "gpu_max": 87},
    power_usage_mw=631250,
    power_limit_mw=700000,
    power_constraints_mw=[200000, 700000],
    energy_mj=98765432109,
    clocks_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1755},
    max_clocks_mhz={"graphics": 1980, "sm": 1981, "memory": 2620, "video": 1756},
    clocks_event_reasons=0x8 | 0x80,
    supported_clocks_event_reasons=0x7FF,
    violation_ns={"power": 11, "thermal": 22, "sync_boost": 33, "board_limit": 44, "low_utilization": 55,
                  "reliability": 66, "total_app_clocks": 77, "total_base_clocks": 88},
    pstate=0,
    fans=[30, 41],
    ecc_mode=[1, 0],
    ecc_errors={"corrected_volatile": 1, "uncorrected_volatile": 2, "corrected_aggregate": 3,
                "uncorrected_aggregate": 4},
    retired_pages={"sbe": [4096, 8192], "dbe": [12288], "pending": True},
    remapped_rows={"correctable": 5, "uncorrectable": 1, "pending": True, "failure": False},
    pcie={"gen": 3, "max_gen": 4, "gpu_max_gen": 5, "width": 8, "max_width": 16, "tx_kbps": 1200, "rx_kbps": 800,
          "replay_counter": 82},
    nvlink=[1, 0, 1],
    mig_mode=[1, 0],
    supported_event_types=0x8 | 0x2,
    processes={
        "compute": [{"pid": 4242, "used_memory": 1073741824, "name": "python"}, {"pid": 77, "used_memory": 2048}],
        "graphics": [{"pid": 1001, "used_memory": None, "name": "Xorg"}],
    },
)  # fmt: skip

NULL_KEYS = (
    "serial", "minor_number", "memory", "utilization", "temperature", "temperature_thresholds", "power_usage_mw",
    "power_limit_mw", "power_constraints_mw", "energy_mj", "clocks_mhz", "max_clocks_mhz", "clocks_event_reasons",
    "supported_clocks_event_reasons", "violation_ns", "pstate", "fans", "ecc_mode", "ecc_errors", "retired_pages",
    "remapped_rows", "pcie", "nvlink", "mig_mode", "supported_event_types", "processes", "pci",
)  # fmt: skip


@pytest.fixture
def rich(sim: Sim) -> Any:
    sim.update(make_state(0, devices=[RICH, make_device(1)], driver_version="590.48.01",
                          nvml_version="13.590.48.01", cuda_driver_version=13010))  # fmt: skip
    sim.nvml.nvmlInit()
    return sim.nvml.nvmlDeviceGetHandleByIndex(0)


def test_identity_and_system(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    assert n.nvmlSystemGetDriverVersion() == "590.48.01"
    assert n.nvmlSystemGetNVMLVersion() == "13.590.48.01"
    assert n.nvmlSystemGetCudaDriverVersion() == 13010
    assert n.nvmlSystemGetCudaDriverVersion_v2() == 13010
    assert n.nvmlDeviceGetCount() == 2
    assert n.nvmlDeviceGetIndex(rich) == 0
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByIndex(1)) == 1
    assert n.nvmlDeviceGetUUID(rich) == RICH["uuid"]
    assert n.nvmlDeviceGetName(rich) == "NVIDIA H100 80GB HBM3"
    assert n.nvmlDeviceGetSerial(rich) == "1654922006536"
    assert n.nvmlDeviceGetMinorNumber(rich) == 3
    pci = n.nvmlDeviceGetPciInfo(rich)
    assert (pci.domain, pci.bus, pci.device) == (1, 0x19, 2)
    assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x233010DE, 0x16C110DE)
    assert pci.busId == "00000001:19:02.0" == bus_id(RICH["pci"])
    assert pci.busIdLegacy == "0001:19:02.0" == bus_id(RICH["pci"], legacy=True)


def test_handle_lookups(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    by_uuid = n.nvmlDeviceGetHandleByUUID(RICH["uuid"].encode())
    assert n.nvmlDeviceGetIndex(by_uuid) == 0
    for form in ("00000001:19:02.0", "1:19:2", "0001:19:02.0"):
        assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(form.encode())) == 0, form
    second = make_device(1)["pci"]
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(b"0D:00.0")) == 1 == second["bus"] - 0x0C
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetHandleByPciBusId(b"00000000:77:00.0")
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetHandleByPciBusId(b"not-a-bus-id")
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetHandleByIndex(2)


def test_memory_utilization_thermal(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    m2 = n.nvmlDeviceGetMemoryInfo(rich, version=n.nvmlMemory_v2)
    assert (m2.total, m2.reserved, m2.used) == (85520809984, 570949632, 4294967296)
    assert m2.free == 85520809984 - 570949632 - 4294967296
    m1 = n.nvmlDeviceGetMemoryInfo(rich)
    assert m1.used == 4294967296 + 570949632  # v1 "used" includes the reserved memory (nvml.h)
    assert m1.free == m2.free and m1.total == m2.total
    u = n.nvmlDeviceGetUtilizationRates(rich)
    assert (u.gpu, u.memory) == (37, 12)
    assert n.nvmlDeviceGetTemperature(rich, n.NVML_TEMPERATURE_GPU) == 54
    assert n.nvmlDeviceGetTemperatureV(rich, n.NVML_TEMPERATURE_GPU) == 54
    thresholds = [n.nvmlDeviceGetTemperatureThreshold(rich, t) for t in range(4)]
    assert thresholds == [92, 89, 95, 87]  # SHUTDOWN, SLOWDOWN, MEM_MAX, GPU_MAX
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetTemperatureThreshold(rich, n.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    assert n.nvmlDeviceGetPerformanceState(rich) == 0
    assert n.nvmlDeviceGetPowerState(rich) == 0
    assert n.nvmlDeviceGetNumFans(rich) == 2
    assert [n.nvmlDeviceGetFanSpeed_v2(rich, i) for i in range(2)] == [30, 41]
    assert n.nvmlDeviceGetFanSpeed(rich) == 30
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetFanSpeed_v2(rich, 2)


def test_power_and_clocks(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    assert n.nvmlDeviceGetPowerUsage(rich) == 631250  # mW
    assert n.nvmlDeviceGetEnforcedPowerLimit(rich) == 700000
    assert n.nvmlDeviceGetPowerManagementLimit(rich) == 700000
    assert n.nvmlDeviceGetPowerManagementLimitConstraints(rich) == [200000, 700000]
    assert n.nvmlDeviceGetTotalEnergyConsumption(rich) == 98765432109  # mJ, 64-bit
    kinds = (n.NVML_CLOCK_GRAPHICS, n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM, n.NVML_CLOCK_VIDEO)
    assert [n.nvmlDeviceGetClockInfo(rich, k) for k in kinds] == [1980, 1980, 2619, 1755]
    assert [n.nvmlDeviceGetMaxClockInfo(rich, k) for k in kinds] == [1980, 1981, 2620, 1756]
    assert n.nvmlDeviceGetCurrentClocksEventReasons(rich) == 0x88
    assert n.nvmlDeviceGetCurrentClocksThrottleReasons(rich) == 0x88
    assert n.nvmlDeviceGetSupportedClocksEventReasons(rich) == 0x7FF
    assert n.nvmlDeviceGetSupportedClocksThrottleReasons(rich) == 0x7FF
    policies = [n.NVML_PERF_POLICY_POWER, n.NVML_PERF_POLICY_THERMAL, n.NVML_PERF_POLICY_SYNC_BOOST,
                n.NVML_PERF_POLICY_BOARD_LIMIT, n.NVML_PERF_POLICY_LOW_UTILIZATION, n.NVML_PERF_POLICY_RELIABILITY,
                n.NVML_PERF_POLICY_TOTAL_APP_CLOCKS, n.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS]  # fmt: skip
    viol = [n.nvmlDeviceGetViolationStatus(rich, p) for p in policies]
    assert [v.violationTime for v in viol] == [11, 22, 33, 44, 55, 66, 77, 88]
    assert viol[0].referenceTime == 1700000000 * 1_000_000  # state clock, in microseconds
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetViolationStatus(rich, 7)


def test_ecc_pages_rows(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    assert n.nvmlDeviceGetEccMode(rich) == [1, 0]
    got = {
        (t, c): n.nvmlDeviceGetTotalEccErrors(rich, t, c)
        for t in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        for c in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)
    }
    assert got == {(0, 0): 1, (1, 0): 2, (0, 1): 3, (1, 1): 4}
    dram = n.NVML_MEMORY_LOCATION_DRAM
    assert n.nvmlDeviceGetMemoryErrorCounter(rich, 0, n.NVML_AGGREGATE_ECC, dram) == 3
    assert n.nvmlDeviceGetMemoryErrorCounter(rich, 0, n.NVML_AGGREGATE_ECC, n.NVML_MEMORY_LOCATION_L1_CACHE) == 0
    sbe, dbe = (
        n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    assert n.nvmlDeviceGetRetiredPages(rich, sbe) == [4096, 8192]
    assert [p["address"] for p in n.nvmlDeviceGetRetiredPages_v2(rich, dbe)] == [12288]
    assert n.nvmlDeviceGetRetiredPagesPendingStatus(rich) == 1
    assert n.nvmlDeviceGetRemappedRows(rich) == (5, 1, 1, 0)


def test_ecc_counters_need_ecc_enabled(sim: Sim) -> None:
    sim.update(make_state(0, devices=[make_device(0, ecc_mode=[0, 1])]))
    sim.nvml.nvmlInit()
    h = sim.nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.nvml.NVMLError_NotSupported):
        sim.nvml.nvmlDeviceGetTotalEccErrors(h, 0, 1)


def test_pcie_nvlink_mig(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(rich) == 3
    assert n.nvmlDeviceGetMaxPcieLinkGeneration(rich) == 4
    assert n.nvmlDeviceGetGpuMaxPcieLinkGeneration(rich) == 5
    assert n.nvmlDeviceGetCurrPcieLinkWidth(rich) == 8
    assert n.nvmlDeviceGetMaxPcieLinkWidth(rich) == 16
    assert n.nvmlDeviceGetPcieThroughput(rich, n.NVML_PCIE_UTIL_TX_BYTES) == 1200  # KB/s
    assert n.nvmlDeviceGetPcieThroughput(rich, n.NVML_PCIE_UTIL_RX_BYTES) == 800
    assert n.nvmlDeviceGetPcieReplayCounter(rich) == 82
    assert [n.nvmlDeviceGetNvLinkState(rich, i) for i in range(3)] == [1, 0, 1]
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetNvLinkState(rich, 3)
    assert n.nvmlDeviceGetMigMode(rich) == [1, 0]
    assert n.nvmlDeviceGetSupportedEventTypes(rich) == 0xA


def test_processes_through_pynvml(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    compute = n.nvmlDeviceGetComputeRunningProcesses(rich)
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [(4242, 1073741824), (77, 2048)]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in compute} == {(0xFFFFFFFF, 0xFFFFFFFF)}
    graphics = n.nvmlDeviceGetGraphicsRunningProcesses(rich)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(1001, None)]  # NVML_VALUE_NOT_AVAILABLE -> None
    assert n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(1)) == []


def test_two_pass_protocol_at_the_abi(sim: Sim, rich: Any) -> None:
    fn = sim.lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(rich, ctypes.byref(count), None) == 7  # INSUFFICIENT_SIZE, with the required count
    assert count.value == 2
    small = (sim.nvml.c_nvmlProcessInfo_v3_t * 1)()
    count.value = 1
    assert fn(rich, ctypes.byref(count), small) == 7
    assert count.value == 2
    exact = (sim.nvml.c_nvmlProcessInfo_v3_t * 2)()
    assert fn(rich, ctypes.byref(count), exact) == 0
    assert (count.value, exact[1].pid, exact[1].usedGpuMemory) == (2, 77, 2048)
    assert fn(rich, None, None) == 2  # INVALID_ARGUMENT for a NULL count
    pages = sim.lib.nvmlDeviceGetRetiredPages
    count.value = 0
    assert pages(rich, 0, ctypes.byref(count), None) == 7
    assert count.value == 2


def test_struct_versions_are_checked(sim: Sim, rich: Any) -> None:
    n = sim.nvml
    mem = n.c_nvmlMemory_v2_t()
    mem.version = 0x01000028  # version 1 stamped on the v2 struct
    assert sim.lib.nvmlDeviceGetMemoryInfo_v2(rich, ctypes.byref(mem)) == 25  # ARGUMENT_VERSION_MISMATCH
    mem.version = n.nvmlMemory_v2
    assert sim.lib.nvmlDeviceGetMemoryInfo_v2(rich, ctypes.byref(mem)) == 0
    with pytest.raises(n.NVMLError_ArgumentVersionMismatch):
        n.nvmlDeviceGetMemoryInfo(rich, version=0x02000010)
    temp = n.c_nvmlTemperature_v1_t()
    temp.version = 0x2000000C
    assert sim.lib.nvmlDeviceGetTemperatureV(rich, ctypes.byref(temp)) == 25


def test_argument_validation(sim: Sim, rich: Any) -> None:
    lib = sim.lib
    assert lib.nvmlDeviceGetPowerUsage(rich, None) == 2  # NULL output pointer
    assert lib.nvmlDeviceGetCount_v2(None) == 2
    buf = ctypes.create_string_buffer(8)
    assert lib.nvmlDeviceGetUUID(rich, buf, ctypes.c_uint(8)) == 7  # INSUFFICIENT_SIZE for a short string buffer
    assert lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(4)) == 7
    bogus = ctypes.c_void_p(12345)
    out = ctypes.c_uint()
    assert lib.nvmlDeviceGetPowerUsage(bogus, ctypes.byref(out)) == 2  # not a handle we gave out
    assert lib.nvmlDeviceGetClockInfo(rich, 9, ctypes.byref(out)) == 2


def test_calls_before_init_are_uninitialized(sim: Sim) -> None:
    out = ctypes.c_uint()
    assert sim.lib.nvmlDeviceGetCount_v2(ctypes.byref(out)) == 1
    assert sim.lib.nvmlShutdown() == 1
    assert sim.lib.nvmlSystemGetDriverVersion(ctypes.create_string_buffer(80), 80) == 1
    sim.lib.nvmlErrorString.restype = ctypes.c_char_p
    assert sim.lib.nvmlErrorString(15) == b"GPU is lost"  # works without init, like the real library


@pytest.mark.parametrize("key", NULL_KEYS)
def test_null_field_reads_not_supported(sim: Sim, key: str) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[make_device(0, **{key: None})], cuda_driver_version=None))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "serial": lambda: n.nvmlDeviceGetSerial(h),
        "minor_number": lambda: n.nvmlDeviceGetMinorNumber(h),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "temperature": lambda: n.nvmlDeviceGetTemperatureV(h, 0),
        "temperature_thresholds": lambda: n.nvmlDeviceGetTemperatureThreshold(h, 1),
        "power_usage_mw": lambda: n.nvmlDeviceGetPowerUsage(h),
        "power_limit_mw": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "power_constraints_mw": lambda: n.nvmlDeviceGetPowerManagementLimitConstraints(h),
        "energy_mj": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
        "clocks_mhz": lambda: n.nvmlDeviceGetClockInfo(h, 0),
        "max_clocks_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(h, 2),
        "clocks_event_reasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "supported_clocks_event_reasons": lambda: n.nvmlDeviceGetSupportedClocksEventReasons(h),
        "violation_ns": lambda: n.nvmlDeviceGetViolationStatus(h, 0),
        "pstate": lambda: n.nvmlDeviceGetPerformanceState(h),
        "fans": lambda: n.nvmlDeviceGetNumFans(h),
        "ecc_mode": lambda: n.nvmlDeviceGetEccMode(h),
        "ecc_errors": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        "retired_pages": lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "remapped_rows": lambda: n.nvmlDeviceGetRemappedRows(h),
        "pcie": lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "nvlink": lambda: n.nvmlDeviceGetNvLinkState(h, 0),
        "mig_mode": lambda: n.nvmlDeviceGetMigMode(h),
        "supported_event_types": lambda: n.nvmlDeviceGetSupportedEventTypes(h),
        "processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "pci": lambda: n.nvmlDeviceGetPciInfo(h),
    }
    with pytest.raises(n.NVMLError_NotSupported):
        calls[key]()
    # the other readings of the same device still work
    assert n.nvmlDeviceGetName(h) == "NVIDIA A10G"


def test_partial_sub_fields_and_system_nulls(sim: Sim) -> None:
    n = sim.nvml
    dev = make_device(0, pcie={"gen": 1, "max_gen": 4, "width": None}, fans=[])
    sim.update(make_state(0, devices=[dev], cuda_driver_version=None))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h) == 1
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetCurrPcieLinkWidth(h)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetPcieReplayCounter(h)
    assert n.nvmlDeviceGetNumFans(h) == 0  # no fans is a reading, not "not supported"
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(n.NVMLError_LibraryNotFound):  # _v2 asks libcuda: absent
        n.nvmlSystemGetCudaDriverVersion_v2()
