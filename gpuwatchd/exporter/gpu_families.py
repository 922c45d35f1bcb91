"""Per-GPU reading families, built from the ``GpuSample``s of present GPUs only.

Each ``*_families`` function is one collector group: it returns its families or raises, and the collector keeps
the other groups going when one raises. Values are already in base units in the model; this module only names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, Spec, label, spec
from gpuwatchd.gpu.clock_events import reason_states
from gpuwatchd.model import OWNER_LABELS, GpuSample, ProcessOwner

_U = ("uuid",)
_NOTE = " Last polled value (the daemon polls in the background; see gpuwatchd_last_poll_timestamp_seconds)."

# -- memory, activity, thermal, power -------------------------------------------------------------------------
MEMORY_TOTAL = spec("gpuwatchd_gpu_memory_total_bytes", "gauge", "Total framebuffer memory of the GPU.", _U, "bytes")
MEMORY_USED = spec(
    "gpuwatchd_gpu_memory_used_bytes", "gauge", "Framebuffer memory in use (excluding driver reserve)." + _NOTE, _U,
    "bytes",
)
MEMORY_RESERVED = spec(
    "gpuwatchd_gpu_memory_reserved_bytes", "gauge", "Framebuffer memory reserved by the driver and firmware.", _U,
    "bytes",
)
MEMORY_FREE = spec("gpuwatchd_gpu_memory_free_bytes", "gauge", "Framebuffer memory free." + _NOTE, _U, "bytes")
UTILIZATION = spec(
    "gpuwatchd_gpu_utilization_ratio", "gauge",
    "Fraction of the last sample period (1/6 s to 1 s) in which a kernel ran on the GPU, 0..1." + _NOTE, _U, "ratio",
)
MEMORY_UTILIZATION = spec(
    "gpuwatchd_gpu_memory_utilization_ratio", "gauge",
    "Fraction of the last sample period in which device memory was read or written, 0..1.", _U, "ratio",
)
PSTATE = spec(
    "gpuwatchd_gpu_performance_state", "gauge", "Performance state: 0 (P0, maximum) to 15 (P15, minimum).", _U
)
TEMPERATURE = spec(
    "gpuwatchd_gpu_temperature_celsius", "gauge", "GPU core temperature." + _NOTE, _U, "celsius"
)
TEMPERATURE_THRESHOLD = spec(
    "gpuwatchd_gpu_temperature_threshold_celsius", "gauge",
    "Temperature thresholds the driver acts on: slowdown, shutdown, gpu_max, memory_max (operating limits).",
    ("uuid", "threshold"), "celsius",
)
TEMPERATURE_MARGIN = spec(
    "gpuwatchd_gpu_temperature_margin_celsius", "gauge",
    "Degrees left before the GPU's nearest slowdown threshold (negative: past it); nvmlDeviceGetMarginTemperature.",
    _U, "celsius",
)
MEMORY_TEMPERATURE = spec(
    "gpuwatchd_gpu_memory_temperature_celsius", "gauge", "Temperature of the GPU's memory (HBM on datacenter parts).",
    _U, "celsius",
)
FAN_SPEED = spec(
    "gpuwatchd_gpu_fan_speed_ratio", "gauge", "Intended fan speed as a fraction of maximum, per fan, 0..1.",
    ("uuid", "fan"), "ratio",
)
POWER = spec("gpuwatchd_gpu_power_watts", "gauge", "Board power draw." + _NOTE, _U, "watts")
POWER_LIMIT = spec("gpuwatchd_gpu_power_limit_watts", "gauge", "Enforced board power limit.", _U, "watts")
POWER_DEFAULT_LIMIT = spec(
    "gpuwatchd_gpu_power_default_limit_watts", "gauge",
    "The board's default power limit (the enforced limit is gpuwatchd_gpu_power_limit_watts).", _U, "watts",
)
POWER_SUPPLY_UNDERSIZED = spec(
    "gpuwatchd_gpu_power_supply_undersized", "gauge",
    "1 when the driver reports the GPU's power source as undersized, 0 when AC or battery (nvmlDeviceGetPowerSource).",
    _U,
)
ENCODER_UTILIZATION = spec(
    "gpuwatchd_gpu_encoder_utilization_ratio", "gauge",
    "Fraction of the driver's sampling period in which the video encoder (NVENC) was busy, 0..1.", _U, "ratio",
)
DECODER_UTILIZATION = spec(
    "gpuwatchd_gpu_decoder_utilization_ratio", "gauge",
    "Fraction of the driver's sampling period in which the video decoder (NVDEC) was busy, 0..1.", _U, "ratio",
)
ENCODER_SESSIONS = spec("gpuwatchd_gpu_encoder_sessions", "gauge", "Active video encoder (NVENC) sessions.", _U)
ENCODER_FPS = spec(
    "gpuwatchd_gpu_encoder_average_fps", "gauge", "Trailing average frame rate of all active encoder sessions.", _U
)
ENCODER_LATENCY = spec(
    "gpuwatchd_gpu_encoder_average_latency_seconds", "gauge", "Average encode latency of the active encoder sessions.",
    _U, "seconds",
)
POWER_MIN_LIMIT = spec(
    "gpuwatchd_gpu_power_min_limit_watts", "gauge", "Lowest power limit that can be configured.", _U, "watts"
)
POWER_MAX_LIMIT = spec(
    "gpuwatchd_gpu_power_max_limit_watts", "gauge", "Highest power limit that can be configured.", _U, "watts"
)
ENERGY = spec(
    "gpuwatchd_gpu_energy_joules_total", "counter",
    "Energy consumed since the driver was loaded (resets on driver reload); rate() gives watts.", _U, "joules",
)
MIG_ENABLED = spec("gpuwatchd_gpu_mig_enabled", "gauge", "1 when MIG mode is enabled, 0 when disabled.", _U)
NVLINK_ACTIVE = spec("gpuwatchd_gpu_nvlink_links_active", "gauge", "Number of NVLink links that are up.", _U)
FIELD_ERROR = spec(
    "gpuwatchd_gpu_field_error_info", "info",
    "A reading that failed this poll for a reason other than 'not supported' (so it has no sample).",
    ("uuid", "field", "reason"),
)

# -- clocks ---------------------------------------------------------------------------------------------------
CLOCK = spec(
    "gpuwatchd_gpu_clock_hertz", "gauge", "Current clock frequency per clock domain (graphics, sm, memory, video).",
    ("uuid", "clock"), "hertz",
)
CLOCK_MAX = spec(
    "gpuwatchd_gpu_clock_max_hertz", "gauge", "Maximum clock frequency per clock domain.", ("uuid", "clock"), "hertz"
)
CLOCKS_EVENT = spec(
    "gpuwatchd_gpu_clocks_event_active", "gauge",
    "1 while a clock event reason (throttle reason) holds the clocks down, 0 when not; one series per reason the"
    " GPU supports. gpu_idle is normal; hw_slowdown, sw_thermal, hw_thermal and hw_power_brake mean trouble.",
    ("uuid", "reason"),
)
VIOLATION = spec(
    "gpuwatchd_gpu_clocks_violation_seconds_total", "counter",
    "Time the clocks were held below target by each NVML performance policy (power, thermal, ...).",
    ("uuid", "policy"), "seconds",
)

# -- memory health --------------------------------------------------------------------------------------------
ECC_ENABLED = spec("gpuwatchd_gpu_ecc_enabled", "gauge", "1 when ECC is enabled now, 0 when disabled.", _U)
ECC_PENDING = spec(
    "gpuwatchd_gpu_ecc_pending_enabled", "gauge", "ECC mode that takes effect after the next reboot (1 on, 0 off).",
    _U,
)
ECC_VOLATILE = spec(
    "gpuwatchd_gpu_ecc_errors_volatile_total", "counter",
    "ECC errors since the driver was loaded, by error=corrected|uncorrected.", ("uuid", "error"),
)
ECC_AGGREGATE = spec(
    "gpuwatchd_gpu_ecc_errors_aggregate_total", "counter",
    "ECC errors over the lifetime of the GPU, by error=corrected|uncorrected.", ("uuid", "error"),
)
RETIRED_PAGES = spec(
    "gpuwatchd_gpu_retired_pages", "gauge",
    "Framebuffer pages retired, by cause=sbe (multiple single-bit errors) | dbe (double-bit error).",
    ("uuid", "cause"),
)
RETIRED_PENDING = spec(
    "gpuwatchd_gpu_retired_pages_pending", "gauge", "1 when a page retirement waits for the next driver reload.", _U
)
REMAPPED_ROWS = spec(
    "gpuwatchd_gpu_remapped_rows", "gauge", "Memory rows remapped, by cause=correctable|uncorrectable.",
    ("uuid", "cause"),
)
REMAP_PENDING = spec(
    "gpuwatchd_gpu_remapped_rows_pending", "gauge", "1 when a row remap waits for a GPU reset.", _U
)
REMAP_FAILED = spec(
    "gpuwatchd_gpu_remapped_rows_failed", "gauge", "1 when a row remap failed (the GPU needs service).", _U
)

# -- PCIe (NVML view) -----------------------------------------------------------------------------------------
PCIE_GEN = spec("gpuwatchd_gpu_pcie_link_generation", "gauge", "Current PCIe link generation (NVML view).", _U)
PCIE_MAX_GEN = spec(
    "gpuwatchd_gpu_pcie_link_max_generation", "gauge",
    "Maximum PCIe link generation of the GPU and system together (NVML view).", _U,
)
PCIE_WIDTH = spec("gpuwatchd_gpu_pcie_link_width", "gauge", "Current PCIe link width in lanes (NVML view).", _U)
PCIE_MAX_WIDTH = spec(
    "gpuwatchd_gpu_pcie_link_max_width", "gauge", "Maximum PCIe link width in lanes (NVML view).", _U
)
PCIE_THROUGHPUT = spec(
    "gpuwatchd_gpu_pcie_throughput_bytes_per_second", "gauge",
    "PCIe throughput over NVML's 20 ms sample window, by direction=tx|rx.", ("uuid", "direction"),
)
PCIE_REPLAYS = spec(
    "gpuwatchd_gpu_pcie_replays_total", "counter", "PCIe replays (link-level retransmissions); rising = bad link.", _U
)
PCIE_REPLAY_ROLLOVERS = spec(
    "gpuwatchd_gpu_pcie_replay_rollovers_total", "counter",
    "Times the PCIe replay counter rolled over (each rollover is many replays).", _U,
)
PCIE_ERRORS = spec(
    "gpuwatchd_gpu_pcie_errors_total", "counter",
    "PCIe errors the GPU counted, by type=correctable|non_fatal|fatal (non_fatal + fatal = uncorrectable) and the "
    "link-layer counters naks_received|naks_sent|bad_tlp|bad_dllp|lcrc|receiver|unsupported_request.",
    ("uuid", "type"),
)
PCIE_LANE_ERRORS = spec(
    "gpuwatchd_gpu_pcie_lane_errors_total", "counter",
    "PCIe errors the GPU counted per lane (0-based); one lane rising alone = one bad lane, cable or connector pin.",
    ("uuid", "lane"),
)

# -- processes ------------------------------------------------------------------------------------------------
PROCESSES = spec(
    "gpuwatchd_gpu_processes", "gauge",
    "Processes holding memory on the GPU (all of them, before the per-GPU top-N cut of the per-process series).", _U,
)
_P = ("uuid", "pid", "process", *OWNER_LABELS)  # owner labels only where known (sources/attribution)
PROCESS_MEMORY = spec(
    "gpuwatchd_gpu_process_memory_used_bytes", "gauge",
    "GPU memory used by one process (top-N processes by memory per GPU).", _P, "bytes",
)
PROCESS_RSS = spec(
    "gpuwatchd_gpu_process_host_rss_bytes", "gauge",
    "Host resident memory of a process that holds GPU memory (top-N per GPU).", _P, "bytes",
)
_PU = "one process used since the previous poll, 0..1 (top-N processes by memory per GPU)."
PROCESS_SM = spec("gpuwatchd_gpu_process_sm_utilization_ratio", "gauge",
                  f"Share of the GPU's SM (3D/compute) time {_PU}", _P, "ratio")
PROCESS_MEMORY_UTIL = spec("gpuwatchd_gpu_process_memory_utilization_ratio", "gauge",
                           f"Share of the GPU's frame-buffer memory bandwidth {_PU}", _P, "ratio")
PROCESS_ENCODER = spec("gpuwatchd_gpu_process_encoder_utilization_ratio", "gauge",
                       f"Share of the video encoder (NVENC) time {_PU}", _P, "ratio")
PROCESS_DECODER = spec("gpuwatchd_gpu_process_decoder_utilization_ratio", "gauge",
                       f"Share of the video decoder (NVDEC) time {_PU}", _P, "ratio")


class Row(NamedTuple):
    """One reading of a ``GpuSample`` field as samples of a family.

    ``label`` is the value of the family's second label when several fields share a family (``ECC_VOLATILE``'s
    ``error="corrected"``); ``EACH`` labels each item of a tuple field with its index (one fan per sample). A bool
    field is exported as 1/0, ``None`` as no sample.
    """

    spec: Spec
    field: str  # the GpuSample field, named like the worker's output key
    label: str | None = None


EACH = "#"

# One table per collector group, in exposition order: a new per-GPU reading is one row here.
VALUE_ROWS = (
    Row(MEMORY_TOTAL, "memory_total_bytes"),
    Row(MEMORY_USED, "memory_used_bytes"),
    Row(MEMORY_RESERVED, "memory_reserved_bytes"),
    Row(MEMORY_FREE, "memory_free_bytes"),
    Row(UTILIZATION, "utilization_gpu_ratio"),
    Row(MEMORY_UTILIZATION, "utilization_memory_ratio"),
    Row(PSTATE, "pstate"),
    Row(ENCODER_UTILIZATION, "encoder_utilization_ratio"),
    Row(DECODER_UTILIZATION, "decoder_utilization_ratio"),
    Row(ENCODER_SESSIONS, "encoder_sessions"),
    Row(ENCODER_FPS, "encoder_average_fps"),
    Row(ENCODER_LATENCY, "encoder_average_latency_seconds"),
    Row(TEMPERATURE, "temperature_celsius"),
    Row(TEMPERATURE_THRESHOLD, "temperature_slowdown_celsius", "slowdown"),
    Row(TEMPERATURE_THRESHOLD, "temperature_shutdown_celsius", "shutdown"),
    Row(TEMPERATURE_THRESHOLD, "temperature_gpu_max_celsius", "gpu_max"),
    Row(TEMPERATURE_THRESHOLD, "temperature_memory_max_celsius", "memory_max"),
    Row(TEMPERATURE_MARGIN, "temperature_margin_celsius"),
    Row(MEMORY_TEMPERATURE, "memory_temperature_celsius"),
    Row(FAN_SPEED, "fan_speed_ratios", EACH),
    Row(POWER, "power_watts"),
    Row(POWER_LIMIT, "power_limit_watts"),
    Row(POWER_MIN_LIMIT, "power_min_limit_watts"),
    Row(POWER_MAX_LIMIT, "power_max_limit_watts"),
    Row(POWER_DEFAULT_LIMIT, "power_default_limit_watts"),
    Row(POWER_SUPPLY_UNDERSIZED, "power_supply_undersized"),
    Row(ENERGY, "energy_joules"),
    Row(MIG_ENABLED, "mig_mode_current"),
    Row(NVLINK_ACTIVE, "nvlink_links_active"),
)
HEALTH_ROWS = (
    Row(ECC_ENABLED, "ecc_mode_current"),
    Row(ECC_PENDING, "ecc_mode_pending"),
    Row(ECC_VOLATILE, "ecc_corrected_volatile", "corrected"),
    Row(ECC_VOLATILE, "ecc_uncorrected_volatile", "uncorrected"),
    Row(ECC_AGGREGATE, "ecc_corrected_aggregate", "corrected"),
    Row(ECC_AGGREGATE, "ecc_uncorrected_aggregate", "uncorrected"),
    Row(RETIRED_PAGES, "retired_pages_sbe", "sbe"),
    Row(RETIRED_PAGES, "retired_pages_dbe", "dbe"),
    Row(RETIRED_PENDING, "retired_pages_pending"),
    Row(REMAPPED_ROWS, "remapped_rows_correctable", "correctable"),
    Row(REMAPPED_ROWS, "remapped_rows_uncorrectable", "uncorrectable"),
    Row(REMAP_PENDING, "remapped_rows_pending"),
    Row(REMAP_FAILED, "remapped_rows_failure"),
)
PCIE_ROWS = (
    Row(PCIE_GEN, "pcie_link_generation"),
    Row(PCIE_MAX_GEN, "pcie_link_max_generation"),
    Row(PCIE_WIDTH, "pcie_link_width"),
    Row(PCIE_MAX_WIDTH, "pcie_link_max_width"),
    Row(PCIE_THROUGHPUT, "pcie_tx_bytes_per_second", "tx"),
    Row(PCIE_THROUGHPUT, "pcie_rx_bytes_per_second", "rx"),
    Row(PCIE_REPLAYS, "pcie_replay_total"),
    Row(PCIE_REPLAY_ROLLOVERS, "pcie_replay_rollover_total"),
)


def _add_rows(f: Families, g: GpuSample, rows: Iterable[Row]) -> None:
    for s, name, extra in rows:
        value = getattr(g, name)
        if extra is None:
            f.add(s, (g.uuid,), value)
        elif extra is EACH:
            for i, item in enumerate(value or ()):
                f.add(s, (g.uuid, str(i)), item)
        else:
            f.add(s, (g.uuid, extra), value)


def value_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """Memory, activity, thermal and power readings."""
    f = Families()
    for g in gpus:
        _add_rows(f, g, VALUE_ROWS)
        for field_name, reason in sorted(g.errors.items()):
            f.info(FIELD_ERROR, {"uuid": g.uuid, "field": field_name, "reason": reason})
    return f.metrics()


def clock_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """Clock frequencies, clock event reasons and violation time."""
    f = Families()
    for g in gpus:
        for clock, hz in sorted(g.clocks_hz.items()):
            f.add(CLOCK, (g.uuid, clock), hz)
        for clock, hz in sorted(g.max_clocks_hz.items()):
            f.add(CLOCK_MAX, (g.uuid, clock), hz)
        if g.clocks_event_reasons is not None:
            for reason, active in reason_states(g.clocks_event_reasons, g.clocks_event_reasons_supported).items():
                f.add(CLOCKS_EVENT, (g.uuid, reason), active)
        for policy, seconds in sorted(g.violation_seconds.items()):
            f.add(VIOLATION, (g.uuid, policy), seconds)
    return f.metrics()


def health_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """ECC, retired pages and remapped rows."""
    f = Families()
    for g in gpus:
        _add_rows(f, g, HEALTH_ROWS)
    return f.metrics()


def pcie_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """PCIe link state, throughput and replays as NVML reports them."""
    f = Families()
    for g in gpus:
        _add_rows(f, g, PCIE_ROWS)
        for kind, count in sorted(g.pcie_errors_total.items()):
            f.add(PCIE_ERRORS, (g.uuid, kind), count)
        for lane, count in sorted(g.pcie_lane_errors_total.items(), key=lambda lc: int(lc[0])):
            f.add(PCIE_LANE_ERRORS, (g.uuid, lane), count)
    return f.metrics()


def process_families(gpus: Iterable[GpuSample],
                     owners: Mapping[tuple[str, int], ProcessOwner] | None = None) -> list[Metric]:
    """Process count and per-process memory (the sample already holds only the top-N), with each process' owner
    labels (container_id, namespace, pod, container, hpc_job) where known."""
    f = Families()
    owners = owners or {}
    for g in gpus:
        f.add(PROCESSES, (g.uuid,), g.processes_total)
        seen: set[int] = set()
        for p in g.processes:
            # A process with both a compute and a graphics context is listed twice by NVML with the same memory;
            # two samples with one label set would be a duplicate series.
            if p.pid in seen:
                continue
            seen.add(p.pid)
            labels = (g.uuid, str(p.pid), label(p.name))
            o = owners.get((g.uuid, p.pid))
            own = o.labels() if o is not None else None
            f.add_owned(PROCESS_MEMORY, labels, own, p.used_memory_bytes)
            f.add_owned(PROCESS_RSS, labels, own, p.host_rss_bytes)
            u = p.utilization_percent
            if u is not None:
                f.add_owned(PROCESS_SM, labels, own, u[0] / 100.0)
                f.add_owned(PROCESS_MEMORY_UTIL, labels, own, u[1] / 100.0)
                f.add_owned(PROCESS_ENCODER, labels, own, u[2] / 100.0)
                f.add_owned(PROCESS_DECODER, labels, own, u[3] / 100.0)
    return f.metrics()
