"""Value types shared by sources, the store, the exporter and the rules.

Every reading is optional: ``None`` means "no reading" (not supported, not permitted, failed this poll), and the
exporter emits no sample for it. Units are base units (bytes, seconds, watts, joules, hertz, ratios 0..1, °C).

Snapshots cross the process boundary between the NVML worker and the daemon as JSON: the worker writes the
dataclass fields as a dict (fields at their default may be left out), the daemon reads it with
:func:`snapshot_from_dict`; adding a field with a default stays compatible.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# The value types of the model's submodules, re-exported: ``from gpuwatchd.model import X`` works for every X.
from gpuwatchd.model.events import ConfigReload as ConfigReload
from gpuwatchd.model.events import DockChange as DockChange
from gpuwatchd.model.events import GpuLostEvent as GpuLostEvent
from gpuwatchd.model.events import HealthChange as HealthChange
from gpuwatchd.model.events import KernelLogCount as KernelLogCount
from gpuwatchd.model.events import KernelLogDriver as KernelLogDriver
from gpuwatchd.model.events import KernelLogLoss as KernelLogLoss
from gpuwatchd.model.events import KernelLogRead as KernelLogRead
from gpuwatchd.model.events import KernelLogStarted as KernelLogStarted
from gpuwatchd.model.events import KernelLogUp as KernelLogUp
from gpuwatchd.model.events import LinkChange as LinkChange
from gpuwatchd.model.events import NvmlCounters as NvmlCounters
from gpuwatchd.model.events import NvmlStale as NvmlStale
from gpuwatchd.model.events import ProbeAvailability as ProbeAvailability
from gpuwatchd.model.events import ProbeBaselineResets as ProbeBaselineResets
from gpuwatchd.model.events import ProbeResultEvent as ProbeResultEvent
from gpuwatchd.model.events import ProbeSkipped as ProbeSkipped
from gpuwatchd.model.events import StateFileSetAside as StateFileSetAside
from gpuwatchd.model.kernel_log import KINDS as KINDS
from gpuwatchd.model.kernel_log import KernelLogStats as KernelLogStats
from gpuwatchd.model.probes import FAILED as FAILED
from gpuwatchd.model.probes import WORKER as WORKER
from gpuwatchd.model.probes import ProbeRecord as ProbeRecord
from gpuwatchd.model.probes import Result as Result
from gpuwatchd.model.probes import Verdict as Verdict

GpuState = Literal["present", "lost", "removed"]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process holding GPU memory on one GPU (from NVML, enriched with host data)."""

    pid: int
    kind: Literal["compute", "graphics"] = "compute"
    used_memory_bytes: int | None = None  # None where the driver cannot attribute memory (Windows WDDM)
    name: str | None = None
    user: str | None = None
    host_rss_bytes: int | None = None
    # per-process utilization since the previous poll (nvml_process_util.py): [sm, memory, encoder, decoder] in
    # percent as NVML reports them (integers: a quarter of the JSON encoding cost of four float ratios per process,
    # bench/poll.py); None where unknown
    utilization_percent: Sequence[int] | None = None
    # What the host says of the pid (sources/nvml/worker/processes.py HostState; docs/alerts.md,
    # GpuMemoryHeldByDeadProcess): "live", "zombie" (exited, not reaped), "gone" (no such pid, and the daemon sees the
    # host's pid namespace), "hidden" (no such pid here, but the daemon's pid namespace is not the host's: a container
    # may hold it); None where not looked up. ``host_state_seconds``: how long the worker has seen it
    # zombie/gone/hidden (an age, not a time: the worker's clock is not the daemon's under a scaled sim clock).
    host_state: str | None = None
    host_state_seconds: float | None = None
    # The daemon's clock when ``host_state_seconds`` was that age (the snapshot's timestamp, set by the daemon's
    # decoder; the worker does not send it): the process has been zombie/gone/hidden since ``host_state_at -
    # host_state_seconds``. None: not known (then "now" stands for it).
    host_state_at: float | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid critical error, from NVML events or (later) the kernel log; both feed the same path."""

    uuid: str | None
    xid: int
    timestamp: float
    source: Literal["nvml", "kmsg"] = "nvml"
    pci_bus_id: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything read from one GPU in one poll."""

    uuid: str
    index: int
    name: str | None = None
    pci_bus_id: str | None = None  # NVML form, e.g. "00000000:0C:00.0"
    serial: str | None = None
    # memory
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    memory_free_bytes: int | None = None
    # activity
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    pstate: int | None = None
    encoder_utilization_ratio: float | None = None  # media engines, over the driver's sampling period
    decoder_utilization_ratio: float | None = None
    encoder_sessions: int | None = None  # active NVENC sessions, their average frame rate and latency
    encoder_average_fps: float | None = None
    encoder_average_latency_seconds: float | None = None
    # thermal
    temperature_celsius: float | None = None
    temperature_margin_celsius: float | None = None  # to the nearest slowdown threshold; negative past it (R565+)
    temperature_slowdown_celsius: float | None = None
    temperature_shutdown_celsius: float | None = None
    temperature_gpu_max_celsius: float | None = None
    temperature_memory_max_celsius: float | None = None
    memory_temperature_celsius: float | None = None  # HBM/GDDR temperature (field value NVML_FI_DEV_MEMORY_TEMP)
    fan_speed_ratios: tuple[float, ...] | None = None
    # power
    power_watts: float | None = None
    power_limit_watts: float | None = None
    power_min_limit_watts: float | None = None
    power_max_limit_watts: float | None = None
    power_default_limit_watts: float | None = None  # the board's default limit (a dock PSU profile lowers the enforced)
    power_supply_undersized: bool | None = None  # nvmlDeviceGetPowerSource answers NVML_POWER_SOURCE_UNDERSIZED
    energy_joules: float | None = None  # since driver load; can go backwards on reload
    # clocks (keys: graphics, sm, memory, video)
    clocks_hz: dict[str, float] = field(default_factory=dict)
    max_clocks_hz: dict[str, float] = field(default_factory=dict)
    clocks_event_reasons: int | None = None  # bit mask, see gpuwatchd.gpu.clock_events
    clocks_event_reasons_supported: int | None = None
    # cumulative time the clocks were held down, per NVML perf policy (power, thermal, ...), seconds
    violation_seconds: dict[str, float] = field(default_factory=dict)
    # ECC / memory health
    ecc_mode_current: bool | None = None
    ecc_mode_pending: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # PCIe (NVML view; sysfs view is in LinkSample)
    pcie_link_generation: int | None = None
    pcie_link_max_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_link_max_width: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_total: int | None = None
    pcie_replay_rollover_total: int | None = None  # field values: the replay counter's rollovers
    # correctable, non_fatal, fatal, naks_received, naks_sent, bad_tlp, bad_dllp, lcrc, receiver, unsupported_request
    pcie_errors_total: dict[str, int] = field(default_factory=dict)  # (field values)
    pcie_lane_errors_total: dict[str, int] = field(default_factory=dict)  # lane number -> errors (field values)
    nvlink_links_active: int | None = None
    # NVLink per link, keyed by the link number as a string (sources/nvml/worker/nvlink.py): state 1 up / 0 down; error
    # counters by kind (crc_flit, crc_data, replay, recovery); data bytes sent and received (field values)
    nvlink_states: dict[str, int] = field(default_factory=dict)
    nvlink_errors_total: dict[str, dict[str, int]] = field(default_factory=dict)
    nvlink_transmit_bytes_total: dict[str, int] = field(default_factory=dict)
    nvlink_receive_bytes_total: dict[str, int] = field(default_factory=dict)
    # nvmlDeviceGpuRecoveryAction_t from field value NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, ...
    recovery_action: int | None = None
    # GPU fabric registration (sources/nvml/worker/fabric.py; NVSwitch systems, Hopper and newer; None: no fabric):
    # NVML_GPU_FABRIC_STATE_* (1 not started, 2 in progress, 3 completed), the registration's nvmlReturn_t, ids
    fabric_state: int | None = None
    fabric_status: int | None = None
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    # P2P status toward each other GPU: peer uuid -> capability (read, write, nvlink) -> nvmlGpuP2PStatus_t (0 OK)
    p2p_status: dict[str, dict[str, int]] = field(default_factory=dict)
    mig_mode_current: bool | None = None
    # processes, top-N by GPU memory (N from config)
    processes: tuple[ProcessSample, ...] = ()
    processes_total: int | None = None  # before the top-N cut
    # field name -> reason, for readings that failed this poll with something other than "not supported"
    errors: dict[str, str] = field(default_factory=dict)
    # GPM activity (sources/nvml/worker/gpm.py; Hopper and newer, MIG instances), averaged between the last two polls
    gpm_graphics_activity_ratio: float | None = None
    gpm_sm_activity_ratio: float | None = None
    gpm_sm_occupancy_ratio: float | None = None
    gpm_tensor_activity_ratio: float | None = None  # any tensor pipe
    gpm_tensor_pipe_activity_ratio: dict[str, float] = field(default_factory=dict)  # hmma, imma, dfma, dmma
    gpm_pipe_activity_ratio: dict[str, float] = field(default_factory=dict)  # fp64, fp32, fp16, integer
    gpm_dram_activity_ratio: float | None = None
    gpm_pcie_bytes_per_second: dict[str, float] = field(default_factory=dict)  # tx, rx
    gpm_nvlink_bytes_per_second: dict[str, float] = field(default_factory=dict)  # tx, rx (all links)
    # A MIG device (sources/nvml/worker/mig.py): keyed by its own MIG-... UUID, ``index`` is its GPU's; None on a GPU.
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str | None = None  # "1g.10gb", from the MIG device's name


# LostGpu reasons for a GPU whose NVML calls block (the worker sets it aside and keeps polling the others):
# suspected while the call has blocked for less than nvml.poll_timeout, hung once it has blocked for longer.
HANG_SUSPECTED = "hang_suspected"
HUNG = "timeout"


@dataclass(frozen=True, slots=True)
class LostGpu:
    """A GPU that enumeration still lists (or listed at init) but that answers GPU_IS_LOST or similar."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    reason: str = "gpu_is_lost"


@dataclass(frozen=True, slots=True)
class LinkSample:
    """PCIe link as sysfs reports it (root injectable); independent of NVML so a hung driver still shows it."""

    pci_bus_id: str  # sysfs form, lower case, e.g. "0000:0c:00.0"
    current_generation: int | None = None
    max_generation: int | None = None
    current_width: int | None = None
    max_width: int | None = None
    present: bool = True


@dataclass(frozen=True, slots=True)
class DockSample:
    """One Thunderbolt/USB4 device (dock, eGPU enclosure) from ``/sys/bus/thunderbolt``; the host router is not one.

    Speeds are per lane, in bits per second, as the kernel reports ``rx_speed``/``tx_speed`` ("20.0 Gb/s", per
    lane: Documentation/ABI/testing/sysfs-bus-thunderbolt). ``gpu_bus_ids`` are the NVIDIA GPUs (sysfs bus id form)
    whose PCI path runs through this device's PCIe tunnel.
    """

    unique_id: str
    route: str  # "0-1": domain 0, route 1
    domain: str  # "domain0"
    security: str | None = None  # the domain's security level: none, user, secure, dponly, usbonly
    authorized: bool | None = None
    vendor: str | None = None
    name: str | None = None
    generation: int | None = None  # 1-3 Thunderbolt, 4 USB4
    rx_speed_bps: float | None = None
    tx_speed_bps: float | None = None
    rx_lanes: int | None = None
    tx_lanes: int | None = None
    gpu_bus_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll of the NVML worker. ``timestamp`` is stamped by the daemon's clock on receipt."""

    timestamp: float
    nvml_ok: bool
    nvml_error: str | None = None  # short reason, e.g. "library_not_found", "driver_not_loaded", "timeout"
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: int | None = None
    device_count: int | None = None
    gpus: tuple[GpuSample, ...] = ()
    lost: tuple[LostGpu, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()
    poll_duration_seconds: float | None = None
    # The worker runs in the host's pid namespace (sources/nvml/worker/processes.py in_host_pid_namespace): NVML's
    # pids are its pids, so a listed pid missing from /proc is dead and a GPU listing no process has none. None:
    # unknown.
    host_pid_namespace: bool | None = None


# The wire form is ``dataclasses.asdict``'s (tuples as lists); these helpers read it without a
# ``dataclasses.fields`` walk per object, which cost ~2/3 of the daemon's per-poll decode at 16 GPUs x 256
# processes (bench/loop.py).


_log = logging.getLogger(__name__)

# A key the worker sends that no model field reads is a reading silently lost (a renamed or unplumbed field).
# Production drops it with one warning per key (an older daemon may read a newer worker's lines) and counts it in
# ``UNKNOWN_KEYS``; tests run strict (tests/conftest.py sets the variable, which the daemon's subprocesses inherit)
# so the mismatch fails the test instead.
STRICT_ENV = "GPUWATCHD_STRICT_SNAPSHOTS"
_mode = {"strict": os.environ.get(STRICT_ENV) == "1"}
UNKNOWN_KEYS: dict[str, int] = {}  # "Class.key" -> times dropped


class UnknownSnapshotKey(ValueError):
    """A snapshot dict carried a key no model field reads (raised only in strict mode)."""


def set_strict_snapshots(strict: bool) -> None:
    """Raise :class:`UnknownSnapshotKey` on unknown keys (``True``) or drop them with a warning (``False``)."""
    _mode["strict"] = strict


def _unknown(cls: type[Any], keys: Iterable[str]) -> None:
    names = sorted(f"{cls.__name__}.{k}" for k in keys)
    if _mode["strict"]:
        raise UnknownSnapshotKey(f"snapshot from the NVML worker has keys no model field reads: {', '.join(names)}")
    for name in names:
        if name not in UNKNOWN_KEYS:
            _log.warning("snapshot key %s is not a model field; dropping it (a newer NVML worker?)", name)
        UNKNOWN_KEYS[name] = UNKNOWN_KEYS.get(name, 0) + 1


_REQUIRED: Any = object()  # a field without a default, or with a default factory: filled by __init__ only


class _Codec:
    """Field names of one slotted dataclass, computed once, and the fast paths that use them."""

    __slots__ = ("cls", "fields", "names", "nameset")

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        fields = dataclasses.fields(cls)
        self.names = tuple(f.name for f in fields)
        self.nameset = frozenset(self.names)
        # Slot descriptors and defaults: writing through the descriptors is what the frozen __init__ does, minus its
        # per-field overhead (the model's dataclasses have no __post_init__ and no validation to skip).
        self.fields = tuple((getattr(cls, f.name).__set__, f.name,
                             f.default if f.default is not dataclasses.MISSING else _REQUIRED) for f in fields)

    def pick(self, data: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in data.items() if k in self.nameset}
        if len(out) != len(data):
            _unknown(self.cls, (k for k in data if k not in self.nameset))
        return out

    def build(self, data: dict[str, Any]) -> Any:
        """One object from its flat dict: known keys only (else the unknown-key path), missing fields defaulted.

        A missing required field, or one whose default is a factory, goes through ``__init__`` (which raises, or
        makes the fresh default), like a dict with an unknown key."""
        if self.nameset.issuperset(data):
            obj = _new(self.cls)
            get = data.get
            for setter, name, default in self.fields:
                value = get(name, default)
                if value is _REQUIRED:
                    break
                setter(obj, value)
            else:
                return obj
        return self.cls(**self.pick(data))

    def decode_all(self, items: Iterable[dict[str, Any]]) -> tuple[Any, ...]:
        build = self.build
        return tuple([build(data) for data in items])


_PROCESS = _Codec(ProcessSample)
_GPU = _Codec(GpuSample)
_LOST = _Codec(LostGpu)
_XID = _Codec(XidEvent)
_SNAPSHOT = _Codec(Snapshot)
_new = object.__new__

# The process field a dead process' ``[pid, age]`` entry carries (``protocol.AGE`` on the worker's side; the model is
# a leaf and does not import it: a test keeps both the same).
AGE = "host_state_seconds"
AT = "host_state_at"  # set by the daemon's decoder, never sent by the worker


class _ProcessMemo:
    """One GPU's process list as last decoded: the wire dicts, their objects, their pids, and where each pid listed
    once is (what a bare pid in the next line stands for). For a process sent as ``[pid, age]`` the dict kept is
    the one before, whose age is older than its object's: only its other fields are read."""

    __slots__ = ("index", "pids", "raw", "samples")

    def __init__(self, raw: list[dict[str, Any]], samples: tuple[ProcessSample, ...], pids: list[Any],
                 index: dict[Any, int] | None = None) -> None:
        self.raw = raw
        self.samples = samples
        self.pids = pids
        self.index = index if index is not None else _unique_index(pids)


def _unique_index(pids: list[Any]) -> dict[Any, int]:
    """pid -> position, for the pids listed once (``protocol.unique_pids``' rule, which the worker follows)."""
    index = {pid: i for i, pid in enumerate(pids)}
    if len(index) != len(pids):
        for pid in _twice(pids):
            del index[pid]
    return index


def _twice(pids: list[Any]) -> set[Any]:
    seen: set[Any] = set()
    twice = set()
    for pid in pids:
        if pid in seen:
            twice.add(pid)
        seen.add(pid)
    return twice


class SnapshotDecoder:
    """:func:`snapshot_from_dict` with a memory of the previous line, for the daemon's intake of the worker's lines.

    Most processes read the same from one poll to the next (pid, name, user, memory, RSS, host state). The worker
    the daemon runs sends those as bare pids (``protocol.SameAsLast``); a bare pid here stands for the dict its
    pid had on that GPU in the previous line, ``[pid, age]`` for that dict with a new ``host_state_seconds``. A
    dict equal to its pid's previous one (a worker without the option) gets the previous object too, and a list
    equal to the previous one (one comparison in C) the previous tuple. Only new or changed processes are built.
    Equal dicts decode to equal objects, so the snapshot is the one :func:`snapshot_from_dict` makes of the full
    line; keeping the objects also keeps the daemon from making thousands of new ones a poll for the garbage
    collector to age (issue 20: 16 GPUs x 256 processes). Unknown keys are checked when a dict is first decoded;
    an equal dict has the same keys. A bare pid with nothing to stand for is a ``ValueError``, as an unreadable
    line is (the supervisor replaces the worker; a fresh one sends in full).
    """

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[str, _ProcessMemo] = {}

    def decode(self, data: dict[str, Any]) -> Snapshot:
        """Build a Snapshot from its dict form, like :func:`snapshot_from_dict` (``data`` is not modified)."""
        memo = self._memo
        fresh: dict[str, _ProcessMemo] = {}
        gpus = []
        for raw in data.get("gpus", ()):
            g = _GPU.pick(raw)
            raw_procs = g.get("processes")
            uuid = g.get("uuid")
            if raw_procs:
                kept = _processes(raw_procs, memo.get(uuid) if isinstance(uuid, str) else None, data.get("timestamp"))
                if isinstance(uuid, str):
                    fresh[uuid] = kept
                g["processes"] = kept.samples
            else:
                g["processes"] = ()
            if g.get("fan_speed_ratios") is not None:
                g["fan_speed_ratios"] = tuple(g["fan_speed_ratios"])
            gpus.append(GpuSample(**g))
        d = _SNAPSHOT.pick(data)
        d["gpus"] = tuple(gpus)
        d["lost"] = _LOST.decode_all(data.get("lost", ()))
        d["xid_events"] = _XID.decode_all(data.get("xid_events", ()))  # up to 256 a poll in an Xid storm
        snap = Snapshot(**d)
        self._memo = fresh
        return snap


# A dead process whose age moved with the clock keeps its object while the time it died, as the daemon computes it
# (snapshot time - age), moves by less than this: the worker's clock and the daemon's receipt of the line differ by
# the pipe's and the event loop's delays, not by seconds. Its "since" then stays what it was first computed as.
AGE_SLACK_SECONDS = 1.0


def _processes(raw: list[Any], prev: _ProcessMemo | None, t: float | None) -> _ProcessMemo:
    """One GPU's processes from their wire form (dicts, or bare pids for the unchanged), reusing the previous
    line's objects where a process is unchanged. ``t``: the snapshot's timestamp (``host_state_at``)."""
    if prev is not None and raw in (prev.pids, prev.raw):  # all unchanged: bare pids, or equal dicts
        return prev
    if prev is not None:
        index, prev_raw, prev_samples = prev.index, prev.raw, prev.samples
    else:
        index, prev_raw, prev_samples = {}, [], ()
    build = _PROCESS.build
    full = []
    samples = []
    pids = []
    for d in raw:
        kind = type(d)
        if kind is int:  # unchanged
            i = index.get(d)
            if i is None:
                raise ValueError(f"process {d} sent as unchanged, but the last line did not list it once")
            full.append(prev_raw[i])
            samples.append(prev_samples[i])
            pids.append(d)
        elif kind is list:  # [pid, age]: a dead process whose age is the only change
            i = index.get(d[0]) if len(d) == 2 else None
            if i is None:
                raise ValueError(f"process {d[0]} sent as aged, but the last line did not list it once")
            full.append(prev_raw[i])
            old = prev_samples[i]
            age = d[1]
            if (t is not None and old.host_state_at is not None and old.host_state_seconds is not None
                    and isinstance(age, (int, float))
                    and abs((t - age) - (old.host_state_at - old.host_state_seconds)) < AGE_SLACK_SECONDS):
                samples.append(old)  # dead since the same time: the same object
            else:
                samples.append(_aged(old, age, t))
            pids.append(d[0])
        else:
            pid = d.get("pid")
            i = index.get(pid)
            if i is not None and prev_raw[i] == d:
                full.append(prev_raw[i])
                samples.append(prev_samples[i])
            else:
                full.append(d)
                sample = build(d)
                if t is not None and sample.host_state_seconds is not None and AT not in d:
                    _set_at(sample, t)
                samples.append(sample)
            pids.append(pid)
    return _ProcessMemo(full, tuple(samples), pids, index if prev is not None and pids == prev.pids else None)


_set = {name: getattr(ProcessSample, name).__set__ for name in _PROCESS.names}
_set_pid, _set_kind, _set_used, _set_name, _set_user, _set_rss, _set_util, _set_state, _set_age, _set_at = (
    _set["pid"], _set["kind"], _set["used_memory_bytes"], _set["name"], _set["user"], _set["host_rss_bytes"],
    _set["utilization_percent"], _set["host_state"], _set[AGE], _set[AT])


def _aged(old: ProcessSample, age: Any, t: float | None) -> ProcessSample:
    """``replace(old, host_state_seconds=age, host_state_at=t)`` through the slots (a test checks that it equals
    the full decode, so a field added to ProcessSample and missed here fails it)."""
    obj = _new(ProcessSample)
    _set_pid(obj, old.pid)
    _set_kind(obj, old.kind)
    _set_used(obj, old.used_memory_bytes)
    _set_name(obj, old.name)
    _set_user(obj, old.user)
    _set_rss(obj, old.host_rss_bytes)
    _set_util(obj, old.utilization_percent)
    _set_state(obj, old.host_state)
    _set_age(obj, age)
    _set_at(obj, t)
    return obj


def snapshot_from_dict(data: dict[str, Any]) -> Snapshot:
    """Build a Snapshot from its dict form, restoring nested types and tuples (``data`` is not modified)."""
    return SnapshotDecoder().decode(data)


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """Who a GPU process belongs to (``gpuwatchd.sources.attribution``); ``None`` = not known, never a guess.

    ``container_id`` is the short (12 hex) id of the container the process runs in, from /proc/PID/cgroup;
    ``namespace``/``pod``/``container`` come from the kubelet's pod-resources answer (and the container runtime's
    metadata where it can be read from files); ``hpc_job`` from the process' Slurm cgroup or the job-mapping
    directory. ``runtime`` and ``image``/``name`` are shown in ``status`` and messages, never exported as labels.
    """

    container_id: str | None = None
    runtime: str | None = None  # docker, containerd, cri-o, podman, nerdctl, systemd-nspawn, kubernetes
    name: str | None = None  # the runtime's container name (Docker, nspawn machine), where readable from files
    image: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    hpc_job: str | None = None

    def labels(self) -> dict[str, str]:
        """The exported/alert labels that are known (absent, not empty, where not)."""
        out = {}
        for k in OWNER_LABELS:
            v = getattr(self, k)
            if v:
                out[k] = v
        return out

    def describe(self) -> str:
        """The phrase after ``name[pid]`` in messages: " in pod ns/pod container c", " in container 3f2a9c1b7d4e
        (web, nginx:1.27)", " in job 4242", or "" for a host process."""
        parts = []
        if self.pod:
            where = f"in pod {self.namespace}/{self.pod}"
            parts.append(where + (f" container {self.container}" if self.container else ""))
        elif self.container_id:
            extra = ", ".join(x for x in (self.name, self.image) if x)
            parts.append(f"in container {self.container_id}" + (f" ({extra})" if extra else ""))
        if self.hpc_job:
            parts.append(f"job {self.hpc_job}" if parts else f"in job {self.hpc_job}")
        return (" " + " ".join(parts)) if parts else ""


# The per-process owner labels, in exposition order (docs/metrics.md).
OWNER_LABELS = ("container_id", "namespace", "pod", "container", "hpc_job")


@dataclass(frozen=True, slots=True)
class GpuPod:
    """One pod container the kubelet gave a GPU or MIG instance to (``gpuwatchd_gpu_pod_info``)."""

    uuid: str
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class Attribution:
    """What the attribution sources know at one time; the daemon hands it to ``Store.ingest``.

    ``owners`` is keyed by (GPU or MIG uuid, pid): a pod or job label depends on the GPU as well as the process.
    ``errors`` counts failures per source (cgroup, kubernetes, hpc_jobs) since start.
    """

    timestamp: float
    owners: Mapping[tuple[str, int], ProcessOwner] = field(default_factory=dict)
    pods: tuple[GpuPod, ...] = ()
    errors: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What we know of a GPU that has been seen at least once; kept after it goes away."""

    uuid: str
    index: int
    name: str | None
    pci_bus_id: str | None
    serial: str | None = None
    parent_uuid: str | None = None  # a MIG device's GPU


@dataclass(frozen=True, slots=True)
class GpuPresence:
    """Presence of a GPU keyed by UUID: present, lost (answers GPU_IS_LOST) or removed (gone from enumeration)."""

    identity: GpuIdentity
    state: GpuState
    last_seen: float  # timestamp of the last snapshot that had readings for it
    since: float  # when it entered ``state``
    first_seen: float | None = None  # first sight by this daemon; since > first_seen while present = came back
    # when it fell off the bus, kept while it then leaves the enumeration (the fall is the incident); None: never
    lost_since: float | None = None
    # its Thunderbolt dock was seen detached while it was away: this absence is a detach (GpuRemoved), even after
    # the dock is back and before the GPU is enumerated again
    dock_left: bool = False


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Self-metrics of one source (node_exporter style): did the last collection work, and how long it took."""

    name: str
    success: bool
    duration_seconds: float
    timestamp: float
    error: str | None = None


Severity = Literal["info", "warning", "critical"]
AlertState = Literal["pending", "firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert instance (identity = alertname + labels), as the rules engine reports it each evaluation.

    Mirrors Prometheus' alerting rule output: ``active_at`` is when the condition started (pending), ``fired_at``
    when the ``for:`` hold elapsed, ``resolved_at`` when the condition cleared.
    """

    name: str
    severity: Severity
    labels: dict[str, str]  # includes alertname, severity, uuid, gpu, model, host, pid/process where relevant
    summary: str
    description: str
    state: AlertState
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    value: float | None = None
    annotations: dict[str, str] = field(default_factory=dict)  # extra, e.g. sparkline, runbook

    @property
    def fingerprint(self) -> str:
        """Stable identity of the alert across evaluations (sorted labels, like Alertmanager's)."""
        return fingerprint(self.labels)


def fingerprint(labels: dict[str, str]) -> str:
    """FNV-1a 64 over sorted label pairs, hex: stable across processes (unlike ``hash``).

    Byte for byte Prometheus' ``LabelSet.Fingerprint`` (name, 0xff, value, 0xff per label), so Alertmanager shows
    the same fingerprint for an alert we post. The separator is the single byte 0xff, not UTF-8 of U+00FF.
    """
    return _fingerprint(tuple(sorted(labels.items())))


@functools.lru_cache(maxsize=16384)
def _fingerprint(pairs: tuple[tuple[str, str], ...]) -> str:
    """Memoized: the rules fingerprint every condition at every evaluation (a few thousand label sets a second on a
    busy 8-GPU host), mostly the same ones, and the byte loop below is the costliest step of an evaluation.

    The bound is above the label sets of one evaluation on a large host (16 GPUs x 256 processes: ~4.1k, one note
    per process): an LRU smaller than the set it cycles through misses every time (at 4096 it did, and the byte loop
    was a third of the daemon's CPU). Entries exist only for label sets seen, so a small host holds a few hundred."""
    h = 0xCBF29CE484222325
    for k, v in pairs:
        for b in k.encode() + b"\xff" + v.encode() + b"\xff":
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
