"""Latest snapshot plus bounded history per GPU and per (GPU, pid), and GPU presence keyed by UUID.

The store is the only state the exporter and the rules read. It does no I/O. History is kept at a configurable
resolution (``step``) for a configurable span (``retention``) so memory is bounded whatever the poll rate:
points closer than ``step`` to the previous one replace it rather than append.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwatchd.gpu.activity import ActivityLog
from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.model import (
    HANG_SUSPECTED,
    Attribution,
    ConfigReload,
    DockChange,
    DockSample,
    GpuIdentity,
    GpuLostEvent,
    GpuPresence,
    GpuSample,
    HealthChange,
    KernelLogCount,
    KernelLogDriver,
    KernelLogLoss,
    KernelLogRead,
    KernelLogStarted,
    KernelLogUp,
    LinkChange,
    LinkSample,
    NvmlCounters,
    NvmlStale,
    ProbeAvailability,
    ProbeBaselineResets,
    ProbeResultEvent,
    ProbeSkipped,
    ProcessOwner,
    Snapshot,
    SourceStatus,
    StateFileSetAside,
    XidEvent,
)
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.model.kernel_log import KernelLogStats
from gpuwatchd.model.training import TorchReport, TrainingSocketStatus
from gpuwatchd.series_cap import bump
from gpuwatchd.store.probes import ProbeLedger
from gpuwatchd.store.training import TrainingLedger

DEFAULT_RETENTION_SECONDS = 3600.0  # the longest rule window (leak trend) needs about an hour
DEFAULT_STEP_SECONDS = 5.0  # 720 points per series: enough for a trend, small enough for 16 GPUs x top-N pids
MAX_XID_EVENTS = 1024  # recent Xid events kept for the status API; counters are kept forever
MAX_SXID_SWITCHES = 64  # an HGX board has 4 NVSwitches, a GB200 NVL72 tray 2: forged addresses stop here


def _stamp(last: dict[str, float], switch: str, t: float | None) -> None:
    """When ``switch`` last logged an SXid (a bounded map: a new switch past the limit is not tracked)."""
    if t is not None and (switch in last or len(last) < MAX_SXID_SWITCHES):
        last[switch] = t


@dataclass(frozen=True, slots=True)
class GpuPoint:
    """The per-GPU readings the rules look at over time (processes are in ProcessPoint)."""

    t: float
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes_memory_bytes: int | None  # sum over all attributed processes
    utilization_gpu_ratio: float | None
    temperature_celsius: float | None
    power_watts: float | None
    clocks_event_reasons: int | None
    violation_seconds: Mapping[str, float]
    pcie_link_generation: int | None
    pcie_link_width: int | None
    pcie_replay_total: int | None
    # link -> error kind -> count (rules/nvlink.py); shared with the sample, never modified
    nvlink_errors_total: Mapping[str, Mapping[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class ProcessPoint:
    """One process' GPU memory and host RSS at one time."""

    t: float
    used_memory_bytes: int | None
    host_rss_bytes: int | None


def _point(t: float, g: GpuSample) -> GpuPoint:
    attributed = [p.used_memory_bytes for p in g.processes if p.used_memory_bytes is not None]
    return GpuPoint(
        t=t,
        memory_used_bytes=g.memory_used_bytes,
        memory_total_bytes=g.memory_total_bytes,
        processes_memory_bytes=sum(attributed) if g.processes_total is not None or attributed else None,
        utilization_gpu_ratio=g.utilization_gpu_ratio,
        temperature_celsius=g.temperature_celsius,
        power_watts=g.power_watts,
        clocks_event_reasons=g.clocks_event_reasons,
        violation_seconds=dict(g.violation_seconds),
        pcie_link_generation=g.pcie_link_generation,
        pcie_link_width=g.pcie_link_width,
        pcie_replay_total=g.pcie_replay_total,
        nvlink_errors_total=g.nvlink_errors_total or None,
    )


def _slot_setter(cls: type[Any], name: str) -> Callable[[Any, Any], None]:
    return getattr(cls, name).__set__  # type: ignore[no-any-return]


# ProcessPoint built through its slots, without the frozen __init__'s per-field overhead: one per process per
# poll, 4096 a poll at 16 GPUs x 256 processes (bench/loop.py).
_new = object.__new__
_set_t = _slot_setter(ProcessPoint, "t")
_set_used = _slot_setter(ProcessPoint, "used_memory_bytes")
_set_rss = _slot_setter(ProcessPoint, "host_rss_bytes")


class _Ring:
    """A deque of timestamped points with a minimum spacing and a maximum age."""

    __slots__ = ("points", "retention", "step")

    def __init__(self, step: float, retention: float) -> None:
        self.step = step
        self.retention = retention
        self.points: deque[GpuPoint | ProcessPoint] = deque(maxlen=max(2, int(retention / step) + 2))

    def add(self, p: GpuPoint | ProcessPoint) -> None:
        pts = self.points
        # Kept points are less than ``step`` apart only at the tail: the newest point always replaces the last one
        # while it is within ``step`` of the point before, and is appended once it is not. So history is at most
        # retention/step points and always ends with the latest reading (at 1 s polls and a 5 s step the kept
        # points sit at t = 0, 4, 8, ... plus the newest; tests/store/test_store.py pins it).
        if len(pts) >= 2 and p.t - pts[-2].t < self.step:
            pts[-1] = p
        else:
            pts.append(p)
        horizon = p.t - self.retention
        while pts and pts[0].t < horizon:
            pts.popleft()

    def after(self, anchor: object) -> tuple[list[GpuPoint], bool, int]:
        """``_after`` on this ring; its last point may still be replaced while it is within ``step`` of the one
        before (once there are two)."""
        out, found = _after(self.points, anchor)
        return out, found, 1 if len(self.points) >= 2 else 0


def _after(pts: deque[Any], anchor: object) -> tuple[list[Any], bool]:
    """The points after ``anchor`` (the same object), oldest first, read from the newest end; all of them, and
    False, when ``anchor`` is None or no longer in the ring."""
    if anchor is not None:
        out: list[Any] = []
        for p in reversed(pts):
            if p is anchor:
                out.reverse()
                return out, True
            out.append(p)
    return list(pts), False


class _ProcRing:
    """A process' history: ``_Ring``'s rule (points ``step`` apart, the newest replacing the last while it is within
    ``step`` of the one before, ``retention`` long), with the newest point kept as plain values.

    Every poll replaces the newest point of every listed process (4096 at 16 GPUs x 256 processes); only one poll
    in ``step`` settles it into the deque. Keeping it as values (and a ``ProcessPoint`` made when it is read, at
    most once per change) spares a new object per process per poll, and the collector those objects' ageing.
    """

    __slots__ = ("newest", "points", "rss", "t", "used")

    def __init__(self, step: float, retention: float) -> None:
        # the settled points; the newest is the (t, used, rss) below
        self.points: deque[ProcessPoint] = deque(maxlen=max(2, int(retention / step) + 2) - 1)
        self.t: float | None = None
        self.used: int | None = None
        self.rss: int | None = None
        self.newest: ProcessPoint | None = None  # the newest as a point, once read (None: not made since it moved)

    def add(self, p: ProcessPoint, step: float, retention: float) -> None:
        """``_Ring.add`` (restoring saved history; ``Store.apply`` inlines the same steps)."""
        pts = self.points
        if self.t is not None and not (pts and p.t - pts[-1].t < step):
            pts.append(self.newest or _proc_point(self.t, self.used, self.rss))
        self.t, self.used, self.rss, self.newest = p.t, p.used_memory_bytes, p.host_rss_bytes, p
        horizon = p.t - retention
        while pts and pts[0].t < horizon:
            pts.popleft()

    def history(self) -> tuple[ProcessPoint, ...]:
        if self.t is None:
            return tuple(self.points)
        newest = self.newest
        if newest is None:
            newest = self.newest = _proc_point(self.t, self.used, self.rss)
        return (*self.points, newest)

    def after(self, anchor: object) -> tuple[list[ProcessPoint], bool, int]:
        """``_after`` on this ring; the newest point (the one not yet settled) may still change."""
        out, found = _after(self.points, anchor)
        if self.t is None:
            return out, found, 0
        newest = self.newest
        if newest is None:
            newest = self.newest = _proc_point(self.t, self.used, self.rss)
        out.append(newest)
        return out, found, 1


def _proc_point(t: float, used: int | None, rss: int | None) -> ProcessPoint:
    point = _new(ProcessPoint)
    _set_t(point, t)
    _set_used(point, used)
    _set_rss(point, rss)
    return point


class Store:
    """Latest snapshot, presence and bounded history. Single-threaded: owned by the daemon's event loop."""

    def __init__(
        self,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        step_seconds: float = DEFAULT_STEP_SECONDS,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.step_seconds = step_seconds
        self.latest: Snapshot | None = None
        self._presence: dict[str, GpuPresence] = {}
        self._gpu_hist: dict[str, _Ring] = {}
        # Every poll's utilization and compute pids per GPU, at full resolution (folded into step buckets): the
        # probe scheduler's proof that a GPU was idle for the whole idle_for (gpuwatchd/gpu/activity.py).
        self.activity = ActivityLog(step_seconds, retention_seconds)
        self._proc_hist: dict[tuple[str, int], _ProcRing] = {}
        # Process rings by time of their newest point, oldest first, so expiry looks only at the rings that expire
        # instead of scanning them all every poll. Exact while timestamps do not go backwards; see _expire.
        self._proc_touched: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._last_apply: float | None = None
        self._sources: dict[str, SourceStatus] = {}
        self._links: dict[str, LinkSample] = {}
        self._docks: tuple[DockSample, ...] = ()
        # GPU uuid -> the Thunderbolt dock it was last seen behind; kept after the dock detaches, so the GpuRemoved
        # alert of its GPU can name it.
        self.gpu_docks: dict[str, DockSample] = {}
        self.xid_counts: dict[tuple[str, int], int] = {}  # (uuid or "unknown", xid) -> count since start
        self.recent_xids: deque[XidEvent] = deque(maxlen=MAX_XID_EVENTS)
        # Events not counted because their family reached its series limit (series_cap.py), by family name.
        self.series_dropped: dict[str, int] = {}
        # State files found unusable at start and moved aside (state_files.py), by file: kernel_log, rule_history.
        self.state_files_set_aside: dict[str, int] = {}
        # What the kernel-log source has seen (sources/kmsg/ingest.py); None when it is not running.
        self.kernel_log: KernelLogStats | None = None
        self.stale = False  # the last poll missed its deadline; values are being held, not refreshed
        # runtime facts the exporter shows next to the data
        self.nvml_worker_restarts = 0
        self.nvml_init_failures = 0
        self.config_reload_success = True
        self.config_reload_timestamp: float | None = None
        # Who holds each GPU process (sources/attribution); None until the attribution source first reports.
        self.attribution: Attribution | None = None
        self.probes = ProbeLedger()  # what the torch health probes found (the probe service's events)
        self.training = TrainingLedger()  # what training processes report of PyTorch's allocator (sources/training)
        # uuid -> health state, reason and action (gpuwatchd/gpu/health.py), set at every rule evaluation
        self.health: dict[str, GpuHealth] = {}
        # Bumped by apply and ingest (the one door), so readers (the /metrics cache) can tell "nothing changed"
        # cheaply.
        self.version = 0

    # -- writers: the one door (apply for snapshots, ingest for events); the version is bumped only here ----------

    def apply(self, snap: Snapshot) -> None:
        """Take a fresh snapshot: update presence, history and Xid counters.

        A GPU the worker set aside as ``hang_suspected`` (its call blocks, not yet for long enough to call it hung)
        keeps its presence and its last readings, which age (``gpuwatchd_gpu_reading_age_seconds``): a guess is
        not a loss, and no alert pages on it.
        """
        held: list[GpuSample] = []
        suspected: set[str] = set()
        if snap.lost and self.latest is not None:
            suspected = {x.uuid for x in snap.lost if x.reason == HANG_SUSPECTED and x.uuid is not None}
            if suspected:
                held = [g for g in self.latest.gpus if g.uuid in suspected]
        self.latest = snap if not held else replace(snap, gpus=tuple(sorted((*snap.gpus, *held),
                                                                            key=lambda g: g.index)))
        self.stale = False
        self.version += 1
        t = snap.timestamp
        step, retention = self.step_seconds, self.retention_seconds
        horizon = t - retention
        proc_hist = self._proc_hist
        touched = self._proc_touched
        move_to_end = touched.move_to_end
        seen: set[str] = set()
        for g in snap.gpus:
            seen.add(g.uuid)
            ident = GpuIdentity(g.uuid, g.index, g.name, g.pci_bus_id, g.serial, g.parent_uuid)
            prev = self._presence.get(g.uuid)
            since = prev.since if prev is not None and prev.state == "present" else t
            first = prev.first_seen if prev is not None else t
            self._presence[g.uuid] = GpuPresence(ident, "present", t, since, first)
            gring = self._gpu_hist.get(g.uuid)
            if gring is None:
                gring = self._gpu_hist[g.uuid] = _Ring(self.step_seconds, self.retention_seconds)
            gring.add(_point(t, g))
            uuid = g.uuid
            self.activity.add(uuid, t, g.utilization_gpu_ratio, [p.pid for p in g.processes if p.kind == "compute"])
            for p in g.processes:
                key = (uuid, p.pid)
                ring = proc_hist.get(key)
                if ring is None:
                    ring = proc_hist[key] = _ProcRing(step, retention)
                # _ProcRing.add, inlined: this loop runs once per process per poll.
                pts = ring.points
                if ring.t is not None and not (pts and t - pts[-1].t < step):
                    pts.append(ring.newest or _proc_point(ring.t, ring.used, ring.rss))
                ring.t = t
                ring.used = p.used_memory_bytes
                ring.rss = p.host_rss_bytes
                ring.newest = None
                if pts and pts[0].t < horizon:
                    while pts and pts[0].t < horizon:
                        pts.popleft()
                touched[key] = t
                move_to_end(key)
        if snap.nvml_ok:
            for lost in snap.lost:
                if lost.uuid is None:
                    continue
                seen.add(lost.uuid)
                if lost.uuid in suspected:
                    continue
                prev = self._presence.get(lost.uuid)
                ident = prev.identity if prev else GpuIdentity(lost.uuid, lost.index, None, lost.pci_bus_id)
                if prev is None or prev.state != "lost":
                    self._presence[lost.uuid] = GpuPresence(
                        ident, "lost", prev.last_seen if prev else t, t, prev.first_seen if prev else t, lost_since=t,
                        dock_left=prev is not None and prev.state != "present" and prev.dock_left,
                    )
            # A GPU missing from a successful enumeration has been removed (dock detached, unbound).
            for uuid, pres in list(self._presence.items()):
                if uuid not in seen and pres.identity.parent_uuid is not None:
                    del self._presence[uuid]  # a MIG device destroyed (or its GPU gone): not a removed GPU
                elif uuid not in seen and pres.state != "removed":
                    self._presence[uuid] = replace(pres, state="removed", since=t)
        if self.training.reports and snap.nvml_ok:  # a report lives as long as its process is listed on its GPU
            self.training.prune((g.uuid, p.pid) for g in self.latest.gpus for p in g.processes)
        for ev in snap.xid_events:
            bump(self.xid_counts, (ev.uuid or "unknown", ev.xid), self.series_dropped, "gpuwatchd_gpu_xid_errors_total")
            self.recent_xids.append(ev)
        self._expire(t)

    def ingest(self, event: Event) -> bool:
        """The one door for everything but snapshots: apply ``event`` and bump the version if it changed anything.

        Returns whether it did (a fall off the bus for a GPU already lost, or never seen, changes nothing)."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"Store.ingest: not an event the store knows: {type(event).__name__}")
        changed = handler(self, event)
        if changed:
            self.version += 1
        return changed

    def _xid(self, ev: XidEvent) -> bool:
        """Count an Xid from a source other than the NVML snapshot (kernel log)."""
        bump(self.xid_counts, (ev.uuid or "unknown", ev.xid), self.series_dropped, "gpuwatchd_gpu_xid_errors_total")
        self.recent_xids.append(ev)
        return True

    def _gpu_lost(self, ev: GpuLostEvent) -> bool:
        """Lost since ``ev.since``; False for a GPU the store has never seen (nothing to name), one already removed
        from enumeration or one already lost since then."""
        prev = self._presence.get(ev.uuid)
        if prev is None or prev.state == "removed":
            return False
        if prev.state == "lost" and prev.since <= ev.since:
            return False
        self._presence[ev.uuid] = GpuPresence(
            prev.identity, "lost", prev.last_seen, ev.since, prev.first_seen, lost_since=ev.since,
            dock_left=prev.state != "present" and prev.dock_left,
        )
        return True

    def _nvml_stale(self, _ev: NvmlStale) -> bool:
        self.stale = True  # keep serving the last values, flagged as stale
        return True

    def _source_status(self, status: SourceStatus) -> bool:
        self._sources[status.name] = status
        return True

    def _attribution(self, attribution: Attribution) -> bool:
        """The owners of the current processes, the pods holding GPUs and the attribution error counts."""
        self.attribution = attribution
        return True

    def _nvml_counters(self, ev: NvmlCounters) -> bool:
        self.nvml_worker_restarts = ev.worker_restarts
        self.nvml_init_failures = ev.init_failures
        return True

    def _links_changed(self, ev: LinkChange) -> bool:
        self._links = {link.pci_bus_id: link for link in ev.links}
        return True

    def _docks_changed(self, ev: DockChange) -> bool:
        self._docks = ev.docks
        by_bus = self._uuid_by_sysfs_bus()
        for d in self._docks:
            for bus in d.gpu_bus_ids:
                uuid = by_bus.get(bus)
                if uuid is not None:
                    self.gpu_docks[uuid] = d
        attached = {d.unique_id for d in self._docks}
        for uuid, pres in list(self._presence.items()):
            dock = self.gpu_docks.get(uuid)
            if pres.state != "present" and not pres.dock_left and dock is not None and dock.unique_id not in attached:
                self._presence[uuid] = replace(pres, dock_left=True)
        return True

    def _config_reload(self, ev: ConfigReload) -> bool:
        self.config_reload_success = ev.success
        if ev.timestamp is not None:
            self.config_reload_timestamp = ev.timestamp
        return True

    def _kernel_log_started(self, _ev: KernelLogStarted) -> bool:
        self.kernel_log = KernelLogStats()
        return True

    def _kernel_log_stats(self) -> KernelLogStats:
        if self.kernel_log is None:
            raise TypeError("Store.ingest: a kernel-log event before KernelLogStarted")
        return self.kernel_log

    def _kernel_log_read(self, ev: KernelLogRead) -> bool:
        stats = self._kernel_log_stats()
        if ev.seq is not None:
            stats.last_seq = ev.seq
        lines = stats.lines
        for kind in ev.kinds:
            lines[kind] += 1
        for count in ev.counts:
            self._kernel_log_count(count)
        return ev.seq is not None or bool(ev.kinds)

    def _kernel_log_count(self, ev: KernelLogCount) -> bool:
        stats = self._kernel_log_stats()
        if ev.series == "xid_reports":
            uuid, xid, source = ev.key
            bump(stats.xid_reports, (uuid, xid, source), self.series_dropped, "gpuwatchd_gpu_xid_reports_total")
        elif ev.series == "sxid":
            bump(stats.sxid, (ev.key[0], ev.key[1]), self.series_dropped, "gpuwatchd_nvswitch_sxid_errors_total")
            _stamp(stats.sxid_last, ev.key[0], ev.t)
        elif ev.series == "sxid_fatal":
            bump(stats.sxid_fatal, (ev.key[0], ev.key[1]), self.series_dropped,
                 "gpuwatchd_nvswitch_sxid_fatal_errors_total")
            _stamp(stats.sxid_fatal_last, ev.key[0], ev.t)
        elif ev.series == "fallen_off_bus":
            bump(stats.fallen_off_bus, ev.key[0], self.series_dropped, "gpuwatchd_gpu_fallen_off_bus_total")
        else:
            uuid, severity = ev.key
            bump(stats.aer, (uuid, severity), self.series_dropped, "gpuwatchd_pcie_aer_errors_total")
        return True

    def _kernel_log_driver(self, ev: KernelLogDriver) -> bool:
        stats = self._kernel_log_stats()
        before = (stats.driver_version, stats.version_mismatch)
        if ev.version is not None:
            stats.driver_version = ev.version
        if ev.mismatch is not None:
            stats.version_mismatch = ev.mismatch
        return (stats.driver_version, stats.version_mismatch) != before

    def _kernel_log_up(self, ev: KernelLogUp) -> bool:
        stats = self._kernel_log_stats()
        if (stats.up, stats.error) == (ev.up, ev.error):
            return False
        stats.up, stats.error = ev.up, ev.error
        return True

    def _kernel_log_loss(self, ev: KernelLogLoss) -> bool:
        stats = self._kernel_log_stats()
        before = (stats.records_lost, stats.records_cut)
        stats.records_lost += ev.lost
        if ev.cut is not None:
            stats.records_cut = ev.cut
        return (stats.records_lost, stats.records_cut) != before

    def _state_file_set_aside(self, ev: StateFileSetAside) -> bool:
        self.state_files_set_aside[ev.name] = self.state_files_set_aside.get(ev.name, 0) + ev.count
        return True

    def _health(self, ev: HealthChange) -> bool:
        if ev.health == self.health:
            return False
        self.health = dict(ev.health)
        return True

    def _probe_availability(self, ev: ProbeAvailability) -> bool:
        led = self.probes
        if (led.available, led.unavailable_reason) == (ev.available, None if ev.available else ev.reason):
            return False
        led.set_available(ev.available, ev.reason)
        return True

    def _probe_skipped(self, ev: ProbeSkipped) -> bool:
        self.probes.skip(ev.uuid, ev.reason, ev.timestamp)
        return True

    def _probe_result(self, ev: ProbeResultEvent) -> bool:
        self.probes.record(list(ev.records), building=ev.building)
        return True

    def _torch_report(self, ev: TorchReport) -> bool:
        return self.training.report(ev)

    def _training_socket(self, ev: TrainingSocketStatus) -> bool:
        return self.training.set_status(ev)

    def _probe_baseline_resets(self, ev: ProbeBaselineResets) -> bool:
        self.probes.baseline_resets = ev.resets
        return True

    # Shorthands for ingest (tests, tools): the same door.

    def add_xid(self, ev: XidEvent) -> None:
        """Count an Xid from a source other than the NVML snapshot (kernel log)."""
        self.ingest(ev)

    def mark_lost(self, uuid: str, since: float) -> bool:
        """The kernel log says a known GPU fell off the bus: lost since ``since``, before NVML notices."""
        return self.ingest(GpuLostEvent(uuid, since))

    def mark_stale(self) -> None:
        """The NVML worker missed its deadline: keep serving the last values, flagged as stale."""
        self.ingest(NvmlStale())

    def set_source_status(self, status: SourceStatus) -> None:
        self.ingest(status)

    def set_attribution(self, attribution: Attribution) -> None:
        """The owners of the current processes, the pods holding GPUs and the attribution error counts."""
        self.ingest(attribution)

    def set_nvml_counters(self, worker_restarts: int, init_failures: int) -> None:
        """The NVML supervisor's counters (it calls this whenever one changes)."""
        self.ingest(NvmlCounters(worker_restarts, init_failures))

    def set_links(self, links: Iterable[LinkSample]) -> None:
        self.ingest(LinkChange(tuple(links)))

    def set_docks(self, docks: Iterable[DockSample]) -> None:
        """The Thunderbolt devices attached now (``sources/sysfs/thunderbolt.py``), with the GPUs behind them."""
        self.ingest(DockChange(tuple(docks)))

    def process_owner(self, uuid: str, pid: int) -> ProcessOwner | None:
        """The container/pod/job a GPU process belongs to, None when unknown or a host process."""
        a = self.attribution
        return a.owners.get((uuid, pid)) if a is not None else None

    def _uuid_by_sysfs_bus(self) -> dict[str, str]:
        return {
            sysfs_bus_id(p.identity.pci_bus_id): uuid
            for uuid, p in self._presence.items()
            if p.identity.pci_bus_id and p.state == "present"
        }

    def _expire(self, now: float) -> None:
        """Drop the history of processes and GPUs whose newest point is older than the retention."""
        horizon = now - self.retention_seconds
        touched = self._proc_touched
        if self._last_apply is not None and now < self._last_apply:
            # The clock went backwards (a test, a replay): _proc_touched is no longer in time order. Restore it,
            # once; a ring's touch time is its newest point's time, so expiry stays exact.
            ordered = sorted(touched.items(), key=lambda kv: kv[1])
            touched.clear()
            touched.update(ordered)
        self._last_apply = now
        while touched:
            key, last = next(iter(touched.items()))
            if last >= horizon:
                break
            del touched[key]
            del self._proc_hist[key]
        for uuid in [u for u, r in self._gpu_hist.items() if not r.points or r.points[-1].t < horizon]:
            del self._gpu_hist[uuid]
            self.activity.forget(self._gpu_hist)

    # -- readers (exporter, rules, status API) -----------------------------------------------------------------

    @property
    def presence(self) -> Mapping[str, GpuPresence]:
        return self._presence

    @property
    def sources(self) -> Mapping[str, SourceStatus]:
        return self._sources

    @property
    def links(self) -> Mapping[str, LinkSample]:
        return self._links

    @property
    def docks(self) -> tuple[DockSample, ...]:
        return self._docks

    def dock_gpu_uuids(self, dock: DockSample) -> list[str]:
        """UUIDs of the present GPUs behind ``dock`` (by PCI bus id)."""
        by_bus = self._uuid_by_sysfs_bus()
        return [u for b in dock.gpu_bus_ids if (u := by_bus.get(b)) is not None]

    def gpu(self, uuid: str) -> GpuSample | None:
        """The latest sample of a present GPU."""
        if self.latest is None:
            return None
        for g in self.latest.gpus:
            if g.uuid == uuid:
                return g
        return None

    def gpu_history(self, uuid: str, since: float | None = None) -> Sequence[GpuPoint]:
        """The GPU's history, oldest first; with ``since``, only its newest points with ``t >= since``: read from
        the newest end, so a rule over the last minutes costs those minutes, not the retained hour."""
        ring = self._gpu_hist.get(uuid)
        if not ring:
            return ()
        if since is None:
            return tuple(ring.points)  # type: ignore[arg-type]
        newest: list[GpuPoint] = []
        for p in reversed(ring.points):
            if p.t < since:
                break
            newest.append(p)  # type: ignore[arg-type]
        newest.reverse()
        return newest

    def process_history(self, uuid: str, pid: int) -> Sequence[ProcessPoint]:
        ring = self._proc_hist.get((uuid, pid))
        return ring.history() if ring is not None else ()

    def process_keys(self) -> Sequence[tuple[str, int]]:
        return tuple(self._proc_hist)

    # -- history carried across a restart (gpuwatchd/store/persist.py) --------------------------------------------

    def gpu_keys(self) -> Sequence[str]:
        return tuple(self._gpu_hist)

    def gpu_history_after(self, uuid: str, anchor: object) -> tuple[list[GpuPoint], bool, int]:
        """What an incremental save of the history needs (``store/journal.py``): the GPU's points after
        ``anchor`` (a point object of its history, or None), oldest first, and whether ``anchor`` was found (if
        not, the whole history); then how many of the newest points may still change (the others never do: a ring
        only appends and drops its oldest)."""
        ring = self._gpu_hist.get(uuid)
        return ring.after(anchor) if ring is not None else ([], False, 0)

    def process_history_after(self, uuid: str, pid: int, anchor: object) -> tuple[list[ProcessPoint], bool, int]:
        """``gpu_history_after`` for a process."""
        ring = self._proc_hist.get((uuid, pid))
        return ring.after(anchor) if ring is not None else ([], False, 0)

    def restore_history(
        self, gpus: Mapping[str, Sequence[GpuPoint]], procs: Mapping[tuple[str, int], Sequence[ProcessPoint]]
    ) -> None:
        """Seed the rings with history saved before a restart (points oldest first); call before any apply."""
        for uuid, gpts in gpus.items():
            ring = self._gpu_hist.setdefault(uuid, _Ring(self.step_seconds, self.retention_seconds))
            for gp in gpts:
                ring.add(gp)
        for key, ppts in procs.items():
            pring = self._proc_hist.setdefault(key, _ProcRing(self.step_seconds, self.retention_seconds))
            for pp in ppts:
                pring.add(pp, self.step_seconds, self.retention_seconds)
            if pring.t is not None:
                self._proc_touched[key] = pring.t
        self._proc_touched = OrderedDict(sorted(self._proc_touched.items(), key=lambda kv: kv[1]))
        self.version += 1

    def keep_history(self, gpus: Iterable[str], procs: Iterable[tuple[str, int]]) -> int:
        """Drop the history of every GPU and process not listed (gone since it was saved); returns how many."""
        keep_g, keep_p = set(gpus), set(procs)
        gone_g = [u for u in self._gpu_hist if u not in keep_g]
        gone_p = [k for k in self._proc_hist if k not in keep_p]
        for u in gone_g:
            del self._gpu_hist[u]
        for k in gone_p:
            del self._proc_hist[k]
            self._proc_touched.pop(k, None)
        return len(gone_g) + len(gone_p)


# What Store.ingest takes: the events of model/events.py and the model values that say what happened.
Event = (XidEvent | GpuLostEvent | NvmlStale | SourceStatus | Attribution | NvmlCounters | LinkChange | DockChange
         | ConfigReload | KernelLogStarted | KernelLogRead | KernelLogCount | KernelLogDriver | KernelLogUp
         | KernelLogLoss | StateFileSetAside | HealthChange | ProbeAvailability | ProbeSkipped
         | ProbeResultEvent | ProbeBaselineResets | TorchReport | TrainingSocketStatus)

_HANDLERS: dict[type[Any], Callable[[Store, Any], bool]] = {
    XidEvent: Store._xid,
    GpuLostEvent: Store._gpu_lost,
    NvmlStale: Store._nvml_stale,
    SourceStatus: Store._source_status,
    Attribution: Store._attribution,
    NvmlCounters: Store._nvml_counters,
    LinkChange: Store._links_changed,
    DockChange: Store._docks_changed,
    ConfigReload: Store._config_reload,
    KernelLogStarted: Store._kernel_log_started,
    KernelLogRead: Store._kernel_log_read,
    KernelLogCount: Store._kernel_log_count,
    KernelLogDriver: Store._kernel_log_driver,
    KernelLogUp: Store._kernel_log_up,
    KernelLogLoss: Store._kernel_log_loss,
    StateFileSetAside: Store._state_file_set_aside,
    HealthChange: Store._health,
    ProbeAvailability: Store._probe_availability,
    ProbeSkipped: Store._probe_skipped,
    ProbeResultEvent: Store._probe_result,
    ProbeBaselineResets: Store._probe_baseline_resets,
    TorchReport: Store._torch_report,
    TrainingSocketStatus: Store._training_socket,
}
