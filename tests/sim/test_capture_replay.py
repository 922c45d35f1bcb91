"""Replay of every real nvidia-smi XML capture in ../shared/data/captures/ (never copied into the repo).

The expected values are read from each capture here with plain XPath and unit arithmetic, independently of
``gpuwatchd.sim.capture``; the state the replay builds must carry exactly those readings, and "N/A" must stay None.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from gpuwatchd.sim.capture import describe_capture, state_from_xml

if TYPE_CHECKING:
    from conftest import Sim

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"
FIXTURES = Path(__file__).parent / "fixtures"  # hand-written: multi-GPU, WDDM and all-N/A shapes the captures lack
MIB = 2**20

# nvidia-smi XML reason suffix -> nvml.h bit, written out from nvml.h's nvmlClocksEventReason* table.
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


def capture_params() -> list[Any]:
    if not CAPTURES.is_dir():
        reason = f"real nvidia-smi captures not available: {CAPTURES} is absent (they live outside the repo)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-captures")]
    files = sorted(CAPTURES.glob("*.xml"))
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no *.xml in {CAPTURES}"), id="no-captures")]
    return [pytest.param(path, id=path.name.split("_")[0]) for path in files]


def fixture_params() -> list[Any]:
    return [pytest.param(path, id=path.stem) for path in sorted(FIXTURES.glob("*.xml"))]


def raw(element: ET.Element, path: str) -> str | None:
    """The capture's text at ``path``; None where nvidia-smi printed N/A (or a bracketed/deprecated marker)."""
    found = element.find(path)
    value = None if found is None or found.text is None else found.text.strip()
    if not value or value == "N/A" or value.startswith("[") or value.startswith("Requested functionality"):
        return None
    return value


def num(element: ET.Element, path: str) -> float | None:
    value = raw(element, path)
    return None if value is None else float(value.split()[0].removesuffix("x"))


def whole(element: ET.Element, path: str) -> int | None:
    value = num(element, path)
    return None if value is None else int(value)


def mib(element: ET.Element, path: str) -> int | None:
    value = num(element, path)
    return None if value is None else int(value * MIB)


def milliwatts(element: ET.Element, *paths: str) -> int | None:
    for path in paths:
        value = num(element, path)
        if value is not None:
            return round(value * 1000)
    return None


def yes(element: ET.Element, path: str) -> bool | None:
    value = raw(element, path)
    return None if value is None else value in ("Yes", "Active", "Enabled")


def ecc_total(gpu: ET.Element, counter: str, corrected: bool) -> int | None:
    total = gpu.find(f"ecc_errors/{counter}/{'single_bit' if corrected else 'double_bit'}/total")
    if total is not None:
        return whole(gpu, f"ecc_errors/{counter}/{'single_bit' if corrected else 'double_bit'}/total")
    names = (
        ["sram_correctable", "dram_correctable"]
        if corrected
        else ["sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable"]
    )
    parts = [whole(gpu, f"ecc_errors/{counter}/{name}") for name in names]
    readable = [part for part in parts if part is not None]
    return sum(readable) if readable else None


def reasons(gpu: ET.Element) -> tuple[int | None, int | None]:
    for section in ("clocks_event_reasons", "clocks_throttle_reasons"):
        found = gpu.find(section)
        if found is None:
            continue
        active = supported = 0
        for child in found:
            bit = REASON_BITS[child.tag.split("_reason_", 1)[1]]
            if raw(found, child.tag) is not None:
                supported |= bit
                active |= bit if raw(found, child.tag) == "Active" else 0
        if supported:  # a section of only N/A: the driver could not read the mask at all
            return active, supported
    return None, None


def expected_readings(gpu: ET.Element) -> dict[str, Any]:
    """Every reading the daemon exports, as the capture prints it, in NVML units."""
    power = "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
    link = "pci/pci_gpu_link_info"
    active, supported = reasons(gpu)
    pstate = raw(gpu, "performance_state")
    retired = {
        cause: whole(gpu, f"retired_pages/{cause}/retired_count")
        for cause in ("multiple_single_bit_retirement", "double_bit_retirement")
    }
    processes: dict[str, dict[int, int | None]] = {"compute": {}, "graphics": {}}
    for info in gpu.iterfind("processes/process_info"):
        pid, kind = int(raw(info, "pid") or -1), raw(info, "type") or ""
        for letter, group in (("C", "compute"), ("G", "graphics")):
            if letter in kind:
                processes[group][pid] = mib(info, "used_memory")
    return {
        "name": raw(gpu, "product_name"),
        "uuid": raw(gpu, "uuid"),
        "bus_id": raw(gpu, "pci/pci_bus_id"),
        "memory_total": mib(gpu, "fb_memory_usage/total"),
        "memory_used": mib(gpu, "fb_memory_usage/used"),
        # drivers before ~510 print no reserve: their "used" already includes it, so the replay reserves 0
        "memory_reserved": None
        if raw(gpu, "fb_memory_usage/total") is None
        else mib(gpu, "fb_memory_usage/reserved") or 0,
        "utilization_gpu": whole(gpu, "utilization/gpu_util"),
        "utilization_memory": whole(gpu, "utilization/memory_util"),
        "temperature": whole(gpu, "temperature/gpu_temp"),
        "temperature_shutdown": whole(gpu, "temperature/gpu_temp_max_threshold"),
        "temperature_slowdown": whole(gpu, "temperature/gpu_temp_slow_threshold"),
        "power_mw": milliwatts(gpu, f"{power}/power_draw", f"{power}/average_power_draw"),
        "power_limit_mw": milliwatts(gpu, f"{power}/enforced_power_limit", f"{power}/current_power_limit"),
        "power_min_mw": milliwatts(gpu, f"{power}/min_power_limit"),
        "power_max_mw": milliwatts(gpu, f"{power}/max_power_limit"),
        "power_default_mw": milliwatts(gpu, f"{power}/default_power_limit"),
        "encoder_util": whole(gpu, "utilization/encoder_util"),
        "memory_temp": whole(gpu, "temperature/memory_temp"),
        "encoder_sessions": whole(gpu, "encoder_stats/session_count"),
        "encoder_latency": whole(gpu, "encoder_stats/average_latency"),
        "decoder_util": whole(gpu, "utilization/decoder_util"),
        **{f"clock_{clock}": whole(gpu, f"clocks/{clock}_clock") for clock in ("graphics", "sm", "mem", "video")},
        **{
            f"max_clock_{clock}": whole(gpu, f"max_clocks/{clock}_clock")
            for clock in ("graphics", "sm", "mem", "video")
        },
        "reasons_active": active,
        "reasons_supported": supported,
        "pstate": None if pstate is None else pynvml.NVML_PSTATE_UNKNOWN if pstate == "Unknown" else int(pstate[1:]),
        "fan": whole(gpu, "fan_speed"),
        "pcie_gen": whole(gpu, f"{link}/pcie_gen/current_link_gen"),
        "pcie_max_gen": whole(gpu, f"{link}/pcie_gen/max_link_gen"),
        "pcie_width": whole(gpu, f"{link}/link_widths/current_link_width"),
        "pcie_max_width": whole(gpu, f"{link}/link_widths/max_link_width"),
        "pcie_replays": whole(gpu, "pci/replay_counter"),
        "ecc_current": yes(gpu, "ecc_mode/current_ecc"),
        "ecc_corrected_volatile": ecc_total(gpu, "volatile", corrected=True),
        "ecc_uncorrected_volatile": ecc_total(gpu, "volatile", corrected=False),
        "ecc_corrected_aggregate": ecc_total(gpu, "aggregate", corrected=True),
        "ecc_uncorrected_aggregate": ecc_total(gpu, "aggregate", corrected=False),
        "retired_sbe": retired["multiple_single_bit_retirement"],
        "retired_dbe": retired["double_bit_retirement"],
        "remapped_correctable": whole(gpu, "remapped_rows/remapped_row_corr"),
        "remapped_uncorrectable": whole(gpu, "remapped_rows/remapped_row_unc"),
        "remapped_pending": yes(gpu, "remapped_rows/remapped_row_pending"),
        "mig_current": yes(gpu, "mig_mode/current_mig"),
        "processes": processes,
    }


def readings_in_state(device: dict[str, Any]) -> dict[str, Any]:
    """The same readings taken from a replayed state device (docs/sim-state.md field names)."""

    def get(*keys: str) -> Any:
        value: Any = device
        for key in keys:
            value = None if value is None else value.get(key)
        return value

    pci = device["pci"]
    pages = device["retired_pages"]
    rows = device["remapped_rows"]
    enabled = {1: True, 0: False, None: None}
    return {
        "name": device["name"],
        "uuid": device["uuid"],
        "bus_id": f"{pci['domain']:08X}:{pci['bus']:02X}:{pci['device']:02X}.0",
        "memory_total": get("memory", "total"),
        "memory_used": get("memory", "used"),
        "memory_reserved": get("memory", "reserved"),
        "utilization_gpu": get("utilization", "gpu"),
        "utilization_memory": get("utilization", "memory"),
        "temperature": device["temperature"],
        "temperature_shutdown": get("temperature_thresholds", "shutdown"),
        "temperature_slowdown": get("temperature_thresholds", "slowdown"),
        "power_mw": device["power_usage_mw"],
        "power_limit_mw": device["power_limit_mw"],
        "power_min_mw": None if device["power_constraints_mw"] is None else device["power_constraints_mw"][0],
        "power_max_mw": None if device["power_constraints_mw"] is None else device["power_constraints_mw"][1],
        "power_default_mw": device["power_default_limit_mw"],
        "encoder_util": device["encoder_utilization"],
        "memory_temp": get("field_values", "memory_temp"),
        "encoder_sessions": get("encoder_stats", "session_count"),
        "encoder_latency": get("encoder_stats", "average_latency_us"),
        "decoder_util": device["decoder_utilization"],
        **{
            f"clock_{k}": get("clocks_mhz", v)
            for k, v in (("graphics", "graphics"), ("sm", "sm"), ("mem", "memory"), ("video", "video"))
        },
        **{
            f"max_clock_{k}": get("max_clocks_mhz", v)
            for k, v in (("graphics", "graphics"), ("sm", "sm"), ("mem", "memory"), ("video", "video"))
        },
        "reasons_active": device["clocks_event_reasons"],
        "reasons_supported": device["supported_clocks_event_reasons"],
        "pstate": device["pstate"],
        "fan": None if device["fans"] is None else device["fans"][0],
        "pcie_gen": get("pcie", "gen"),
        "pcie_max_gen": get("pcie", "max_gen"),
        "pcie_width": get("pcie", "width"),
        "pcie_max_width": get("pcie", "max_width"),
        "pcie_replays": get("pcie", "replay_counter"),
        "ecc_current": None if device["ecc_mode"] is None else enabled[device["ecc_mode"][0]],
        "ecc_corrected_volatile": get("ecc_errors", "corrected_volatile"),
        "ecc_uncorrected_volatile": get("ecc_errors", "uncorrected_volatile"),
        "ecc_corrected_aggregate": get("ecc_errors", "corrected_aggregate"),
        "ecc_uncorrected_aggregate": get("ecc_errors", "uncorrected_aggregate"),
        "retired_sbe": None if pages is None else len(pages["sbe"]),
        "retired_dbe": None if pages is None else len(pages["dbe"]),
        "remapped_correctable": None if rows is None else rows["correctable"],
        "remapped_uncorrectable": None if rows is None else rows["uncorrectable"],
        "remapped_pending": None if rows is None else rows["pending"],
        "mig_current": None if device["mig_mode"] is None else enabled[device["mig_mode"][0]],
        "processes": {
            group: {p["pid"]: p["used_memory"] for p in device["processes"][group]} for group in ("compute", "graphics")
        },
    }


@pytest.mark.parametrize("capture", capture_params())
def test_state_carries_every_reading_of_the_capture(capture: Path) -> None:
    root = ET.parse(capture).getroot()
    state = state_from_xml(capture)
    gpus = root.findall("gpu")
    assert len(state["devices"]) == len(gpus) >= 1
    assert state["driver_version"] == raw(root, "driver_version")
    major, minor = (raw(root, "cuda_version") or "").split(".")
    assert state["cuda_driver_version"] == int(major) * 1000 + int(minor) * 10
    for gpu, device in zip(gpus, state["devices"], strict=True):
        assert readings_in_state(device) == expected_readings(gpu)


@pytest.mark.parametrize("capture", capture_params())
def test_describe_capture_names_every_gpu(capture: Path) -> None:
    root = ET.parse(capture).getroot()
    lines = describe_capture(capture).splitlines()
    for line, gpu in zip(lines, root.iterfind("gpu"), strict=True):
        assert raw(gpu, "uuid") in line and raw(gpu, "product_name") in line and gpu.get("id") in line


NOT_SUPPORTED = "NOT_SUPPORTED"


def memory_temperature(n: Any, h: Any) -> int | None:
    """NVML_FI_DEV_MEMORY_TEMP through nvmlDeviceGetFieldValues; its own NOT_SUPPORTED reads as None."""
    (value,) = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_MEMORY_TEMP])
    if value.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED:
        return None
    assert value.nvmlReturn == n.NVML_SUCCESS and value.valueType == n.NVML_VALUE_TYPE_UNSIGNED_INT
    return int(value.value.uiVal)


def readings_through_pynvml(n: Any, handle: Any) -> dict[str, Any]:
    """The same readings, asked of the stand-in through the real pynvml; NOT_SUPPORTED reads as None.

    Any other NVML error propagates and fails the test: "N/A" must replay as exactly NOT_SUPPORTED.
    """
    unsupported: list[str] = []

    def ask(key: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except n.NVMLError_NotSupported:
            unsupported.append(key)
            return None

    def part(key: str, call: Callable[[], Any], pick: Callable[[Any], Any]) -> Any:
        value = ask(key, call)
        return None if value is None else pick(value)

    h = handle
    clocks = {"graphics": n.NVML_CLOCK_GRAPHICS, "sm": n.NVML_CLOCK_SM, "mem": n.NVML_CLOCK_MEM,
              "video": n.NVML_CLOCK_VIDEO}  # fmt: skip
    sbe, dbe = (
        n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    corrected, uncorrected = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    volatile, aggregate = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
    memory = ask("memory", lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2))
    utilization = ask("utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
    constraints = ask("power_constraints", lambda: n.nvmlDeviceGetPowerManagementLimitConstraints(h))
    active = ask("reasons_active", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
    supported = ask("reasons_supported", lambda: n.nvmlDeviceGetSupportedClocksEventReasons(h))
    rows = ask("remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
    processes: dict[str, dict[int, int | None]] = {}
    for group, call in (("compute", n.nvmlDeviceGetComputeRunningProcesses),
                        ("graphics", n.nvmlDeviceGetGraphicsRunningProcesses)):  # fmt: skip
        processes[group] = {p.pid: p.usedGpuMemory for p in call(h)}
    readings = {
        "name": n.nvmlDeviceGetName(h),
        "uuid": n.nvmlDeviceGetUUID(h),
        "bus_id": n.nvmlDeviceGetPciInfo(h).busId,
        "memory_total": None if memory is None else memory.total,
        "memory_used": None if memory is None else memory.used,
        "memory_reserved": None if memory is None else memory.reserved,
        "utilization_gpu": None if utilization is None else utilization.gpu,
        "utilization_memory": None if utilization is None else utilization.memory,
        "temperature": ask("temperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        "temperature_shutdown": ask(
            "shutdown", lambda: n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        ),
        "temperature_slowdown": ask(
            "slowdown", lambda: n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        ),
        "power_mw": ask("power", lambda: n.nvmlDeviceGetPowerUsage(h)),
        "power_limit_mw": ask("power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h)),
        "power_min_mw": None if constraints is None else constraints[0],
        "power_max_mw": None if constraints is None else constraints[1],
        "power_default_mw": ask("power_default", lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(h)),
        "encoder_util": part("encoder", lambda: n.nvmlDeviceGetEncoderUtilization(h), lambda v: v[0]),
        "memory_temp": memory_temperature(n, h),
        "encoder_sessions": part("encoder_stats", lambda: n.nvmlDeviceGetEncoderStats(h), lambda v: v[0]),
        "encoder_latency": part("encoder_latency", lambda: n.nvmlDeviceGetEncoderStats(h), lambda v: v[2]),
        "decoder_util": part("decoder", lambda: n.nvmlDeviceGetDecoderUtilization(h), lambda v: v[0]),
        **{f"clock_{k}": ask(f"clock_{k}", lambda c=c: n.nvmlDeviceGetClockInfo(h, c)) for k, c in clocks.items()},
        **{
            f"max_clock_{k}": ask(f"max_clock_{k}", lambda c=c: n.nvmlDeviceGetMaxClockInfo(h, c))
            for k, c in clocks.items()
        },
        "reasons_active": active,
        "reasons_supported": supported,
        "pstate": ask("pstate", lambda: n.nvmlDeviceGetPerformanceState(h)),
        "fan": ask("fan", lambda: n.nvmlDeviceGetFanSpeed(h)),
        "pcie_gen": ask("pcie_gen", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie_max_gen": ask("pcie_max_gen", lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "pcie_width": ask("pcie_width", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie_max_width": ask("pcie_max_width", lambda: n.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "pcie_replays": ask("pcie_replays", lambda: n.nvmlDeviceGetPcieReplayCounter(h)),
        "ecc_current": part("ecc_mode", lambda: n.nvmlDeviceGetEccMode(h), lambda mode: bool(mode[0])),
        "ecc_corrected_volatile": ask("ecc", lambda: n.nvmlDeviceGetTotalEccErrors(h, corrected, volatile)),
        "ecc_uncorrected_volatile": ask("ecc", lambda: n.nvmlDeviceGetTotalEccErrors(h, uncorrected, volatile)),
        "ecc_corrected_aggregate": ask("ecc", lambda: n.nvmlDeviceGetTotalEccErrors(h, corrected, aggregate)),
        "ecc_uncorrected_aggregate": ask("ecc", lambda: n.nvmlDeviceGetTotalEccErrors(h, uncorrected, aggregate)),
        "retired_sbe": part("retired", lambda: n.nvmlDeviceGetRetiredPages(h, sbe), len),
        "retired_dbe": part("retired", lambda: n.nvmlDeviceGetRetiredPages(h, dbe), len),
        "remapped_correctable": None if rows is None else rows[0],
        "remapped_uncorrectable": None if rows is None else rows[1],
        "remapped_pending": None if rows is None else bool(rows[2]),
        "mig_current": part("mig", lambda: n.nvmlDeviceGetMigMode(h), lambda mode: bool(mode[0])),
        "processes": processes,
    }
    return readings


def replay_through_pynvml(sim: Sim, capture: Path) -> None:
    """Serve ``capture`` from the stand-in and check every reading pynvml gets against the capture's own text."""
    n = sim.nvml
    root = ET.parse(capture).getroot()
    sim.update(state_from_xml(capture))
    n.nvmlInit()
    assert n.nvmlSystemGetDriverVersion() == raw(root, "driver_version")
    cuda = raw(root, "cuda_version")
    if cuda is None:
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlSystemGetCudaDriverVersion()
    else:
        major, minor = cuda.split(".")
        assert n.nvmlSystemGetCudaDriverVersion() == int(major) * 1000 + int(minor) * 10
    gpus = root.findall("gpu")
    assert n.nvmlDeviceGetCount() == len(gpus)
    for index, gpu in enumerate(gpus):
        handle = n.nvmlDeviceGetHandleByIndex(index)
        assert readings_through_pynvml(n, handle) == expected_readings(gpu), f"GPU {index} of {capture.name}"
        # the same device answers by its UUID and bus id, as the daemon keys GPUs by UUID
        assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(raw(gpu, "uuid"))) == index


@pytest.mark.parametrize("capture", capture_params())
def test_capture_reads_back_through_pynvml(sim: Sim, capture: Path) -> None:
    replay_through_pynvml(sim, capture)


@pytest.mark.parametrize("capture", fixture_params())
def test_fixture_reads_back_through_pynvml(sim: Sim, capture: Path) -> None:
    replay_through_pynvml(sim, capture)


def test_na_raises_not_supported_through_pynvml(sim: Sim) -> None:
    """A reading printed N/A is NVMLError_NotSupported, not 0 or another error (all_na.xml)."""
    n = sim.nvml
    sim.update(state_from_xml(FIXTURES / "all_na.xml"))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls = [
        lambda: n.nvmlDeviceGetMemoryInfo(h),
        lambda: n.nvmlDeviceGetUtilizationRates(h),
        lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        lambda: n.nvmlDeviceGetPowerUsage(h),
        lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda: n.nvmlDeviceGetFanSpeed(h),
        lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
        lambda: n.nvmlDeviceGetPcieReplayCounter(h),
        lambda: n.nvmlDeviceGetEccMode(h),
        lambda: n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        lambda: n.nvmlDeviceGetRemappedRows(h),
        lambda: n.nvmlDeviceGetMigMode(h),
        lambda: n.nvmlDeviceGetSerial(h),
        lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
    ]
    for number, call in enumerate(calls):
        with pytest.raises(n.NVMLError_NotSupported):
            call()
            pytest.fail(f"call {number} returned a value")
    assert n.nvmlDeviceGetName(h) == "NVIDIA RTX A2000"


def test_wddm_process_memory_reads_as_none_through_pynvml(sim: Sim) -> None:
    """WDDM's "N/A" process memory arrives as NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None."""
    n = sim.nvml
    sim.update(state_from_xml(FIXTURES / "wddm_processes.xml"))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    compute = n.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [(1234, None), (9876, None)]
