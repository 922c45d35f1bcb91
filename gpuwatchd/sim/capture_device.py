"""One ``<gpu>`` element of an ``nvidia-smi -q -x`` dump -> one device of the stand-in state (docs/sim-state.md).

Covers the schemas seen in real captures: 418.x (``clocks_throttle_reasons``, per-location ECC ``single_bit`` /
``double_bit`` with ``total``, ``power_readings``), 5xx (``sram_*``/``dram_*`` ECC, ``remapped_rows``) and 535+/590
(``clocks_event_reasons``, ``gpu_power_readings`` with ``average_``/``instant_power_draw``, event-reason counters).
A reading the capture lacks stays None, which the stand-in serves as NVML_ERROR_NOT_SUPPORTED.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from typing import Any

from gpuwatchd.sim.capture_mig import mig_devices_from_gpu
from gpuwatchd.sim.capture_values import (
    MIB,
    CaptureError,
    enable_pair,
    first_text,
    flag,
    hex_int,
    integer,
    mib_bytes,
    parse_quantity,
    quantity,
    text,
    watts_mw,
    where,
)

# <clocks_event_reason_X> / <clocks_throttle_reason_X> -> nvmlClocksEventReason* bit (nvml.h, "Clocks Event
# Reasons"; the throttle names are deprecated aliases with the same values).
CLOCK_EVENT_REASON_BITS: dict[str, int] = {
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
_REASON_SECTIONS = (
    ("clocks_event_reasons", "clocks_event_reason_"),
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),
)

# <clocks_event_reasons_counters_X> (us) -> violation_ns key. nvml.h (nvmlDeviceGetViolationStatus notes) equates
# NVML_PERF_POLICY_POWER with the SW_POWER_CAP counter, THERMAL with SW_THERM_SLOWDOWN, SYNC_BOOST with SYNC_BOOST;
# the hw_* counters have no perf-policy slot and are not replayed.
_VIOLATION_COUNTERS = {"sw_power_cap": "power", "sw_therm_slowdown": "thermal", "sync_boost": "sync_boost"}

# nvml.h NVML_PSTATE_UNKNOWN: a successful nvmlDeviceGetPerformanceState that nvidia-smi prints as "Unknown".
PSTATE_UNKNOWN = 32

# First page address synthesized for retired pages, whose addresses the XML prints only as a count on the drivers
# captured. Any distinct page-aligned values do; 4 KiB pages from 0x1000 read plainly in a debugger.
_SYNTH_PAGE_BASE = 0x1000
_PAGE_SIZE = 0x1000


def device_from_gpu(gpu: ET.Element) -> dict[str, Any]:
    """The stand-in device dict for one ``<gpu>`` element."""
    uuid = text(gpu, "uuid")
    name = text(gpu, "product_name")
    if uuid is None or name is None:
        raise CaptureError(f"{where(gpu, 'uuid' if uuid is None else 'product_name')}: required, but absent or N/A")
    reasons, supported = _clock_event_reasons(gpu)
    processes = _processes(gpu)
    mig_mode = enable_pair(gpu, "mig_mode/current_mig", "mig_mode/pending_mig", gpu=gpu)
    # MIG devices (sim/capture_mig.py), while MIG is on: they take the processes that run in them
    migs = mig_devices_from_gpu(gpu, uuid, processes) if mig_mode and mig_mode[0] else None
    return {
        "uuid": uuid,
        "name": name,
        "serial": text(gpu, "serial"),
        "minor_number": integer(gpu, "minor_number", gpu=gpu),
        "pci": _pci(gpu),
        "memory": _memory(gpu),
        "utilization": _utilization(gpu),
        # the media engines: nvmlDeviceGetEncoderUtilization / nvmlDeviceGetDecoderUtilization, N/A when absent
        "encoder_utilization": integer(gpu, "utilization/encoder_util", "%", gpu=gpu),
        "decoder_utilization": integer(gpu, "utilization/decoder_util", "%", gpu=gpu),
        "encoder_stats": _encoder_stats(gpu),
        "temperature": integer(gpu, "temperature/gpu_temp", "C", gpu=gpu),
        "temperature_thresholds": _temperature_thresholds(gpu),
        "field_values": _field_values(gpu),
        **_power(gpu),
        "energy_mj": None,  # no nvidia-smi XML schema seen so far prints total energy; never invent it
        "clocks_mhz": _clocks(gpu, "clocks"),
        "max_clocks_mhz": _clocks(gpu, "max_clocks"),
        "clocks_event_reasons": reasons,
        "supported_clocks_event_reasons": supported,
        "violation_ns": _violations(gpu),
        "pstate": _pstate(gpu),
        "fans": _fans(gpu),
        "ecc_mode": enable_pair(gpu, "ecc_mode/current_ecc", "ecc_mode/pending_ecc", gpu=gpu),
        "ecc_errors": _ecc_errors(gpu),
        "retired_pages": _retired_pages(gpu),
        "remapped_rows": _remapped_rows(gpu),
        "pcie": _pcie(gpu),
        "mig_mode": mig_mode,
        "processes": processes,
        **({"mig_devices": migs} if migs is not None else {}),
    }


def _pci(gpu: ET.Element) -> dict[str, Any] | None:
    bus = hex_int(gpu, "pci/pci_bus", gpu=gpu)
    device = hex_int(gpu, "pci/pci_device", gpu=gpu)
    domain = hex_int(gpu, "pci/pci_domain", gpu=gpu)
    if bus is None or device is None or domain is None:
        return None
    pci: dict[str, Any] = {"domain": domain, "bus": bus, "device": device}
    # The ids share one struct (nvmlPciInfo_t) with the bus id, so they cannot be NOT_SUPPORTED on their own: an
    # unreadable id is left out and the state writer serves it as 0, as an unfilled struct field reads.
    for key, tag in (("pci_device_id", "pci_device_id"), ("pci_subsystem_id", "pci_sub_system_id")):
        value = hex_int(gpu, f"pci/{tag}", gpu=gpu)
        if value is not None:
            pci[key] = value
    return pci


def _memory(gpu: ET.Element) -> dict[str, int] | None:
    total = mib_bytes(gpu, "fb_memory_usage/total", gpu=gpu)
    used = mib_bytes(gpu, "fb_memory_usage/used", gpu=gpu)
    if total is None or used is None:
        return None
    # Drivers before ~510 print no <reserved>: their "used" is NVML v1 used, which already includes the reserve.
    reserved = mib_bytes(gpu, "fb_memory_usage/reserved", gpu=gpu) or 0
    return {"total": total, "reserved": reserved, "used": used}


def _utilization(gpu: ET.Element) -> dict[str, int] | None:
    busy = integer(gpu, "utilization/gpu_util", "%", gpu=gpu)
    memory = integer(gpu, "utilization/memory_util", "%", gpu=gpu)
    # nvmlDeviceGetUtilizationRates returns both in one call, so one missing half makes the call unsupported.
    if busy is None or memory is None:
        return None
    return {"gpu": busy, "memory": memory}


def _encoder_stats(gpu: ET.Element) -> dict[str, int] | None:
    # nvidia-smi prints nvmlDeviceGetEncoderStats' three outputs; the latency is in microseconds there too.
    out: dict[str, int] = {}
    for key, tag in (("session_count", "session_count"), ("average_fps", "average_fps"),
                     ("average_latency_us", "average_latency")):
        value = integer(gpu, f"encoder_stats/{tag}", gpu=gpu)
        if value is None:
            return None  # one call answers all three
        out[key] = value
    return out


def _field_values(gpu: ET.Element) -> dict[str, int] | None:
    # nvidia-smi prints only the memory temperature of the stand-in's field values (none of the PCIe counters).
    memory = integer(gpu, "temperature/memory_temp", "C", gpu=gpu)
    return None if memory is None else {"memory_temp": memory}


def _temperature_thresholds(gpu: ET.Element) -> dict[str, int | None]:
    def read(name: str) -> int | None:
        return integer(gpu, f"temperature/{name}", "C", gpu=gpu)

    return {
        "shutdown": read("gpu_temp_max_threshold"),
        "slowdown": read("gpu_temp_slow_threshold"),
        "mem_max": read("gpu_temp_max_mem_threshold"),
        "gpu_max": read("gpu_temp_max_gpu_threshold"),
    }


def _power(gpu: ET.Element) -> dict[str, Any]:
    section = "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
    # nvmlDeviceGetPowerUsage is what <power_draw> printed; 590.x splits it, and nvml.h documents PowerUsage as the
    # 1 s average on Ampere-and-later, so the average is preferred over the instant reading.
    draw_path = next(
        (
            f"{section}/{tag}"
            for tag in ("power_draw", "average_power_draw", "instant_power_draw")
            if text(gpu, f"{section}/{tag}") is not None
        ),
        f"{section}/power_draw",
    )
    # The enforced limit is what NVML serves as the limit; 535+ print it as <current_power_limit>.
    limit_path = next(
        (
            f"{section}/{tag}"
            for tag in ("enforced_power_limit", "current_power_limit", "power_limit")
            if text(gpu, f"{section}/{tag}") is not None
        ),
        f"{section}/power_limit",
    )
    low = watts_mw(gpu, f"{section}/min_power_limit", gpu=gpu)
    high = watts_mw(gpu, f"{section}/max_power_limit", gpu=gpu)
    return {
        "power_usage_mw": watts_mw(gpu, draw_path, gpu=gpu),
        "power_limit_mw": watts_mw(gpu, limit_path, gpu=gpu),
        "power_constraints_mw": None if low is None or high is None else [low, high],
        # nvmlDeviceGetPowerManagementDefaultLimit
        "power_default_limit_mw": watts_mw(gpu, f"{section}/default_power_limit", gpu=gpu),
    }


def _clocks(gpu: ET.Element, section: str) -> dict[str, int | None]:
    def read(tag: str) -> int | None:
        return integer(gpu, f"{section}/{tag}", "MHz", gpu=gpu)

    return {
        "graphics": read("graphics_clock"),
        "sm": read("sm_clock"),
        "memory": read("mem_clock"),
        "video": read("video_clock"),
    }


def _clock_event_reasons(gpu: ET.Element) -> tuple[int | None, int | None]:
    """(active mask, supported mask); supported = the reasons the capture prints a state for."""
    for section, prefix in _REASON_SECTIONS:
        element = gpu.find(section)
        if element is None:
            continue
        active = supported = 0
        for child in element:
            reason = child.tag.removeprefix(prefix)
            bit = CLOCK_EVENT_REASON_BITS.get(reason)
            if not child.tag.startswith(prefix) or bit is None:
                raise CaptureError(f"{where(gpu, f'{section}/{child.tag}')}: unknown clocks event reason")
            state = flag(element, child.tag, gpu=gpu)
            if state is None:
                continue
            supported |= bit
            if state:
                active |= bit
        if supported:
            return active, supported
    return None, None


def _violations(gpu: ET.Element) -> dict[str, int]:
    counters = gpu.find("clocks_event_reasons_counters")
    found: dict[str, int] = {}
    if counters is None:
        return found
    prefix = "clocks_event_reasons_counters_"
    for reason, policy in _VIOLATION_COUNTERS.items():
        micros = integer(counters, prefix + reason, "us", gpu=gpu)
        if micros is not None:
            found[policy] = micros * 1000
    return found


def _pstate(gpu: ET.Element) -> int | None:
    value = text(gpu, "performance_state")
    if value is None:
        return None
    if value.lower() == "unknown":
        return PSTATE_UNKNOWN
    if len(value) < 2 or len(value) > 3 or value[0] != "P" or not (value[1:].isascii() and value[1:].isdigit()):
        raise CaptureError(f"{where(gpu, 'performance_state')}: expected P0..P15, got {value[:40]!r}")
    return int(value[1:])


def _fans(gpu: ET.Element) -> list[int] | None:
    # nvidia-smi prints the speed of fan 0 only; a board with more fans replays as a one-fan board.
    speed = integer(gpu, "fan_speed", "%", gpu=gpu)
    return None if speed is None else [speed]


def _ecc_errors(gpu: ET.Element) -> dict[str, int | None] | None:
    if gpu.find("ecc_errors") is None:
        return None
    errors = {
        "corrected_volatile": _ecc_total(gpu, "volatile", corrected=True),
        "uncorrected_volatile": _ecc_total(gpu, "volatile", corrected=False),
        "corrected_aggregate": _ecc_total(gpu, "aggregate", corrected=True),
        "uncorrected_aggregate": _ecc_total(gpu, "aggregate", corrected=False),
    }
    return None if all(count is None for count in errors.values()) else errors


def _ecc_total(gpu: ET.Element, counter: str, *, corrected: bool) -> int | None:
    """Total for nvmlDeviceGetTotalEccErrors: old schema prints it, newer ones print sram/dram parts to sum."""
    old = f"ecc_errors/{counter}/{'single_bit' if corrected else 'double_bit'}/total"
    if gpu.find(old) is not None:
        return integer(gpu, old, gpu=gpu)
    section = gpu.find(f"ecc_errors/{counter}")
    if section is None:
        return None
    total: int | None = None
    for child in section:
        location, _, kind = child.tag.partition("_")
        counted = kind == "correctable" if corrected else kind.startswith("uncorrectable")
        if location not in ("sram", "dram") or not counted:
            continue  # e.g. sram_threshold_exceeded is a flag, not a count
        count = integer(section, child.tag, gpu=gpu)
        if count is not None:
            total = (total or 0) + count
    return total


def _retired_pages(gpu: ET.Element) -> dict[str, Any] | None:
    sbe = _retired_addresses(gpu, "multiple_single_bit_retirement", start=_SYNTH_PAGE_BASE)
    dbe_start = _SYNTH_PAGE_BASE + _PAGE_SIZE * len(sbe or [])
    dbe = _retired_addresses(gpu, "double_bit_retirement", start=dbe_start)
    if sbe is None or dbe is None:
        return None
    pending = flag(gpu, "retired_pages/pending_retirement", gpu=gpu)
    return {"sbe": sbe, "dbe": dbe, "pending": pending}


def _retired_addresses(gpu: ET.Element, cause: str, *, start: int) -> list[int] | None:
    """``retired_count`` page addresses: those the capture prints, then synthesized distinct ones."""
    count = integer(gpu, f"retired_pages/{cause}/retired_count", gpu=gpu)
    if count is None:
        return None
    # Where a driver prints addresses, it is as 0x%016x under <retired_pagelist> or (older) <retired_page_addresses>.
    section = gpu.find(f"retired_pages/{cause}")
    listed = [
        hex_int(element, ".", gpu=gpu) or 0
        for element in (section.iter() if section is not None else ())
        if (element.text or "").strip().lower().startswith("0x")
    ]
    addresses = list(dict.fromkeys(listed))[:count]
    candidates = itertools.count(start, _PAGE_SIZE)
    while len(addresses) < count:
        address = next(candidates)
        if address not in addresses:
            addresses.append(address)
    return addresses


def _remapped_rows(gpu: ET.Element) -> dict[str, Any] | None:
    def read(tag: str) -> int | None:
        return integer(gpu, f"remapped_rows/{tag}", gpu=gpu)

    correctable, uncorrectable = read("remapped_row_corr"), read("remapped_row_unc")
    pending = flag(gpu, "remapped_rows/remapped_row_pending", gpu=gpu)
    failure = flag(gpu, "remapped_rows/remapped_row_failure", gpu=gpu)
    if correctable is None or uncorrectable is None or pending is None or failure is None:
        return None  # <remapped_rows>N/A</remapped_rows>: pre-Ampere boards have no row remapper
    return {"correctable": correctable, "uncorrectable": uncorrectable, "pending": pending, "failure": failure}


def _pcie(gpu: ET.Element) -> dict[str, int | None]:
    link = "pci/pci_gpu_link_info"

    def kbps(tag: str) -> int | None:
        value = quantity(gpu, f"pci/{tag}", "KB/s", gpu=gpu)
        return None if value is None else round(value)

    return {
        "gen": integer(gpu, f"{link}/pcie_gen/current_link_gen", gpu=gpu),
        "max_gen": integer(gpu, f"{link}/pcie_gen/max_link_gen", gpu=gpu),
        # 510+ print the GPU's own maximum separately (nvmlDeviceGetGpuMaxPcieLinkGeneration); older ones do not.
        "gpu_max_gen": integer(gpu, f"{link}/pcie_gen/max_device_link_gen", gpu=gpu),
        "width": integer(gpu, f"{link}/link_widths/current_link_width", "x", gpu=gpu),
        "max_width": integer(gpu, f"{link}/link_widths/max_link_width", "x", gpu=gpu),
        "tx_kbps": kbps("tx_util"),
        "rx_kbps": kbps("rx_util"),
        "replay_counter": integer(gpu, "pci/replay_counter", gpu=gpu),
    }


def _processes(gpu: ET.Element) -> dict[str, list[dict[str, Any]]]:
    compute: list[dict[str, Any]] = []
    graphics: list[dict[str, Any]] = []
    for number, info in enumerate(gpu.iterfind("processes/process_info")):
        path = f"processes/process_info[{number + 1}]"
        try:
            pid = integer(info, "pid", gpu=None)
        except CaptureError as e:  # name the process element, not a bare "pid"
            raise CaptureError(f"{where(gpu, path)}/{e}") from None
        kind = text(info, "type")
        if pid is None or kind is None:
            raise CaptureError(f"{where(gpu, path)}: a process needs a pid and a type")
        used = text(info, "used_memory")  # "N/A" under Windows WDDM, where the driver cannot attribute memory
        entry: dict[str, Any] = {
            "pid": pid,
            "used_memory": None if used is None else round(parse_quantity(used, "MiB", where(gpu, path)) * MIB),
            "name": first_text(info, "process_name"),
        }
        # nvidia-smi types: C compute, G graphics, C+G both, M (MPS) and M+C compute through MPS.
        kinds = set(kind.upper().split("+"))
        if not kinds or not kinds <= {"C", "G", "M"}:
            raise CaptureError(f"{where(gpu, path + '/type')}: unknown process type {kind!r}")
        if kinds & {"C", "M"}:
            compute.append(entry)
        if "G" in kinds:
            graphics.append(dict(entry))
    return {"compute": compute, "graphics": graphics}
