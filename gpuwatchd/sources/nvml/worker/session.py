"""One NVML session inside the worker process: enumeration, per-GPU polls, GPUs set aside while their calls block.

Imports pynvml (only the worker process loads this module). :class:`Worker` is shared by the poller threads of
:mod:`gpuwatchd.sources.nvml.worker.main` (each passes its own
:class:`~gpuwatchd.sources.nvml.worker.stall_watch.Position`); a thread whose generation is no longer current stops at
its next step. The snapshot it returns is the ``Snapshot`` dict form (pipe encoding), with host facts of the kept
processes from the resolver it was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.protocol import (
    HANG_SUSPECTED,
    HUNG,
    NOT_IN_A_GPU_CALL,
    PROGRESS_BYTES,
    encode_progress,
)
from gpuwatchd.sources.nvml.worker.errors import ABSENT_CODES, LOST_CODES, TIMEOUT, NvmlGpuLost, reason
from gpuwatchd.sources.nvml.worker.mig import MigDevice, MigSet
from gpuwatchd.sources.nvml.worker.process_util import Utilization, attach
from gpuwatchd.sources.nvml.worker.processes import (
    merge_processes,
    pid_max,
    process_dicts_per_gpu,
    top_processes,
)
from gpuwatchd.sources.nvml.worker.readings import STATIC_REFRESH_SECONDS, DeviceReadings, worker_log
from gpuwatchd.sources.nvml.worker.stall_watch import Position, Stuck

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    from gpuwatchd.sources.nvml.worker.processes import Resolver

# When the supervisor does not say (tests, bench): a GPU whose call has blocked this long (real seconds of the
# worker running) is reported hung rather than suspected; nvml.poll_timeout's default.
DEFAULT_HANG_AFTER_SECONDS = 5.0
# Bound on Xid events drained per poll so an event storm cannot starve the poll; the rest wait for the next one.
MAX_EVENTS_PER_POLL = 256


def _addr(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class _Device:
    __slots__ = ("addr", "handle", "index", "mig", "name", "pci_bus_id", "readings", "serial", "uuid")

    def __init__(self, index: int, handle: Any, static_refresh: float = STATIC_REFRESH_SECONDS,
                 peers: Callable[[], list[tuple[str, Any]]] | None = None) -> None:
        self.index = index
        self.handle = handle
        self.addr = _addr(handle)
        self.uuid: str = N.nvmlDeviceGetUUID(handle)
        self.name: str | None = _optional(N.nvmlDeviceGetName, handle)
        pci = _optional(N.nvmlDeviceGetPciInfo, handle)
        self.pci_bus_id: str | None = pci.busId if pci is not None else None
        self.serial: str | None = _optional(N.nvmlDeviceGetSerial, handle)
        self.readings = DeviceReadings(handle, static_refresh=static_refresh, peers=peers)
        self.mig = MigSet.open(handle)  # its MIG devices (sources/nvml/worker/mig.py); None: not MIG-capable


def _optional(fn: Any, handle: Any) -> Any:
    """A static attribute that may be unsupported (serial on GeForce); GPU loss still propagates."""
    try:
        return fn(handle)
    except N.NVMLError as e:
        if e.value in LOST_CODES:
            raise
        return None


class Worker:
    """One NVML session: ``start()`` (init), then ``poll()`` repeatedly; the first poll enumerates the GPUs.

    Poller threads share it (:mod:`gpuwatchd.sources.nvml.worker.stall_watch`): each passes its own :class:`Position`,
    and a thread whose generation is no longer current stops at its next step without emitting anything.
    """

    def __init__(self, top_n: int, resolver: Resolver | None, *, progress_fd: int | None = None,
                 hang_after: float = DEFAULT_HANG_AFTER_SECONDS, only: set[int] | None = None,
                 static_refresh: float = STATIC_REFRESH_SECONDS) -> None:
        self.top_n = top_n
        self.static_refresh = static_refresh  # readings.STATIC_READINGS: seconds between their reads
        self.only = only  # the GPU indices to open (a retry of GPUs that hung); None: all
        self.hang_after = hang_after
        # One int32 the supervisor reads after a missed deadline: the index of the GPU being called (-1: none).
        self._progress = mmap.mmap(progress_fd, PROGRESS_BYTES) if progress_fd is not None else None
        self.resolver = resolver
        self.pid_limit = pid_max()
        self.devices: list[_Device] = []  # replaced, never changed in place: pollers iterate it without the lock
        self.lost: list[dict[str, Any]] = []
        self.device_count = 0
        self.system: dict[str, Any] = {}
        self.event_set: Any = None
        self.by_addr: dict[int | None, str] = {}
        self.reenumerate: str | None = None  # why this worker should be replaced after the current snapshot
        self._polled = False
        self._next_index = 0  # the next GPU index to enumerate
        self._reopen: list[int] = []  # released GPUs that hung while being opened: open them again
        self.gen = 0
        self.pos = Position(0)  # the current poller's position
        # Set when a poller enters a GPU's calls from outside them: the stall watch sleeps on it between polls
        # instead of ticking every check period (gpuwatchd.sources.nvml.worker.stall_watch.watch).
        self.activity = threading.Event()
        self.stuck: dict[int, Stuck] = {}  # index -> the GPU set aside while a call on it blocks
        self._lock = threading.Lock()

    # -- start ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """nvmlInit (no-GPU flag: a driver without GPUs is "up with 0 GPUs"), system facts, count, event set."""
        N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
        for key, fn in (
            ("driver_version", N.nvmlSystemGetDriverVersion),
            ("nvml_version", N.nvmlSystemGetNVMLVersion),
            ("cuda_driver_version", N.nvmlSystemGetCudaDriverVersion),
        ):
            with contextlib.suppress(N.NVMLError):
                self.system[key] = fn()
        self.device_count = N.nvmlDeviceGetCount()
        try:
            self.event_set = N.nvmlEventSetCreate()
        except N.NVMLError as e:
            worker_log(f"no NVML events: {reason(e.value)}")

    def _enumerate(self, pos: Position) -> bool:
        """Open the GPUs not opened yet (each may block); False when this thread was set aside meanwhile."""
        while True:
            with self._lock:
                if pos.gen != self.gen:  # set aside after its last GPU was opened: that one is done
                    abandoned = True
                else:
                    abandoned = False
                    if self._reopen:
                        i = self._reopen.pop(0)
                    elif self._next_index < self.device_count:
                        i = self._next_index
                        self._next_index += 1
                    else:
                        return True
                    if self.only is None or i in self.only:
                        self._at(pos, i)  # under the lock: the watchdog blames only a GPU this thread is in
                    else:
                        continue
            if abandoned:
                self._answered(pos)
                return False
            try:
                dev: _Device | None = _Device(i, N.nvmlDeviceGetHandleByIndex(i), self.static_refresh,
                                              self._peers_of(i))
            except N.NVMLError as e:
                # Listed but unusable (lost, no permission, ...): report it and poll the others.
                dev = None
                why = reason(e.value)
            if dev is not None:
                self._register_events(dev)
            with self._lock:
                st = self.stuck.get(i)
                if pos.gen != self.gen and (st is None or st.pos is not pos):
                    return False  # released and reopened by another thread meanwhile: that one's result counts
                if st is not None and st.pos is pos:
                    del self.stuck[i]
                if dev is not None:
                    self.devices = sorted([*self.devices, dev], key=lambda d: d.index)
                    self.by_addr[dev.addr] = dev.uuid
                else:
                    self.lost.append({"index": i, "reason": why})
            if pos.gen != self.gen:
                return False

    def _peers_of(self, index: int) -> Callable[[], list[tuple[str, Any]]]:
        """The other opened GPUs of this worker as (uuid, handle), for the P2P status of GPU ``index``."""

        def peers() -> list[tuple[str, Any]]:
            return [(d.uuid, d.handle) for d in self.devices if d.index != index]

        return peers

    def enumerated(self) -> bool:
        return not self._reopen and self._next_index >= self.device_count

    def _at(self, pos: Position, index: int) -> None:
        was_idle = pos.index == NOT_IN_A_GPU_CALL
        pos.index = index
        pos.seq += 1
        if was_idle and index != NOT_IN_A_GPU_CALL:
            self.activity.set()  # after the position: a watcher that cleared the event then sees the call
        if self._progress is not None and pos.gen == self.gen:
            self._progress[:PROGRESS_BYTES] = encode_progress(index)

    def _register_events(self, dev: _Device) -> None:
        if self.event_set is None:
            return
        try:
            mask = N.nvmlEventTypeXidCriticalError & N.nvmlDeviceGetSupportedEventTypes(dev.handle)
            if mask:
                N.nvmlDeviceRegisterEvents(dev.handle, mask, self.event_set)
        except N.NVMLError as e:
            # NOT_SUPPORTED means "no Xid events for this GPU", not unhealthy (k8s-device-plugin#1562).
            if e.value not in ABSENT_CODES:
                worker_log(f"GPU {dev.uuid}: Xid events not registered: {reason(e.value)}", "WARNING")

    # -- GPUs whose calls block -------------------------------------------------------------------------------

    def set_aside(self, pos: Position, blocked: float) -> Position | None:
        """The watchdog's verdict on the current poller, inside a call on GPU ``pos.index`` for ``blocked``
        seconds: that GPU is left out and a new generation takes over. Returns the new poller's position."""
        with self._lock:
            if pos is not self.pos or pos.index == NOT_IN_A_GPU_CALL:
                return None
            dev = next((d for d in self.devices if d.index == pos.index), None)
            self.stuck[pos.index] = Stuck(pos.index, pos, dev.uuid if dev else None,
                                          dev.pci_bus_id if dev else None, blocked)
            self.gen += 1
            self.pos = Position(self.gen)
            return self.pos

    def release(self, index: int) -> None:
        """A retry found GPU ``index`` answering: poll it again (the thread blocked in its old call is left)."""
        with self._lock:
            st = self.stuck.pop(index, None)
            if st is not None and not any(d.index == index for d in self.devices):
                self._reopen.append(index)  # it hung while being opened

    def _answered(self, pos: Position) -> None:
        """An abandoned poller is back from the GPU it was set aside on: poll that GPU again."""
        with self._lock:
            for index in [i for i, st in self.stuck.items() if st.pos is pos]:
                del self.stuck[index]

    def _stuck_entries(self, skipped: dict[int, Stuck]) -> list[dict[str, Any]]:
        """The set-aside GPUs as lost entries: those stuck now, and those this poll skipped as stuck whose call has
        returned since (the abandoned poller came back mid-poll). Without the latter, a GPU skipped by this poll
        would be in neither the GPUs nor the lost list, and a successful enumeration without a GPU reads as its
        removal (a false GpuRemoved seen under CPU load, where a slow GPU is set aside and answers a moment later).
        """
        every = {**skipped, **self.stuck}
        return [{"index": st.index, "uuid": st.uuid, "pci_bus_id": st.pci_bus_id,
                 "reason": HUNG if st.blocked >= self.hang_after else HANG_SUSPECTED}
                for st in sorted(every.values(), key=lambda st: st.index)]

    # -- poll -------------------------------------------------------------------------------------------------

    def poll(self, pos: Position | None = None) -> dict[str, Any] | None:
        """One snapshot (pipe encoding), or None when this poller was set aside during it; sets ``reenumerate``
        when a fresh worker is needed afterwards."""
        pos = self.pos if pos is None else pos
        if not self.enumerated() and not self._enumerate(pos):
            return None
        t0 = time.monotonic()
        gpus = []
        newly_lost = []
        # (GPU's out dict, kept processes): host facts are resolved once for all GPUs after the loop
        kept: list[tuple[dict[str, Any], list[tuple[int, str, int | None]]]] = []
        utils: dict[int, Utilization] = {}  # id(out) -> per-process utilization of its kept processes
        at = self._at
        lock = self._lock
        stuck = dict(self.stuck)  # the GPUs this poll skips (a copy: the watchdog and returning calls change it)
        # Each step from one GPU to the next checks for a set-aside and moves the position in one step under the
        # watchdog's lock (set_aside takes it too): the GPU blamed is always one whose calls or readings this thread
        # was in, and the thread always learns it was set aside, so it ends that set-aside itself (_answered).
        # Otherwise a poller set aside between its last check and the next move (its last GPU's process
        # resolution, say) sent its snapshot anyway (dropped as stale) and never ended the set-aside: its GPU was
        # shown hung, then lost (GpuLost, critical), until a retry worker freed it.
        abandoned = False
        for dev in self.devices:
            if stuck and dev.index in stuck:
                continue
            with lock:
                if pos.gen != self.gen:
                    abandoned = True
                    break
                at(pos, dev.index)
            out: dict[str, Any] = {"uuid": dev.uuid, "index": dev.index, "name": dev.name,
                                   "pci_bus_id": dev.pci_bus_id, "serial": dev.serial}
            errors: dict[str, str] = {}
            migs: list[tuple[dict[str, Any], list[tuple[int, str, int | None]], Utilization | None]] = []
            try:
                dev.readings.poll(out, errors)
                if dev.mig is not None:  # MIG-capable: its MIG devices, and whether its MIG configuration changed
                    migs = self._poll_mig(dev, out)
                if migs:  # the GPU's process list is their aggregate: processes are attributed to them
                    top = []
                else:
                    top = self._processes(dev, out, errors)
                    if top:  # bounded by the top-N: read only where processes are kept
                        util = self._process_util(dev, errors)
                        if util is not None:
                            utils[id(out)] = util
            except NvmlGpuLost as e:
                newly_lost.append((dev, e.reason))
                top = []
            if newly_lost and newly_lost[-1][0] is dev:
                continue
            if errors:
                out["errors"] = errors
            if top:
                kept.append((out, top))
            gpus.append(out)
            for mig_out, mig_top, mig_util in migs:
                if mig_top:
                    kept.append((mig_out, mig_top))
                if mig_util is not None:
                    utils[id(mig_out)] = mig_util
                gpus.append(mig_out)
        with lock:
            abandoned = abandoned or pos.gen != self.gen
            at(pos, NOT_IN_A_GPU_CALL)
        if abandoned:  # set aside in a GPU's calls or readings, which have now returned
            self._answered(pos)
            if newly_lost:
                self._lose(newly_lost)
            return None
        if kept:
            for (out, _), procs in zip(kept, process_dicts_per_gpu([t for _, t in kept], self.resolver), strict=True):
                out["processes"] = procs
                if id(out) in utils:
                    attach(procs, utils[id(out)])
        if newly_lost:
            self._lose(newly_lost)
        xids = self._drain_events()
        self._check_count()
        self._polled = True
        snap: dict[str, Any] = {"timestamp": time.time(), "nvml_ok": True, "device_count": self.device_count,
                                "gpus": gpus, "poll_duration_seconds": time.monotonic() - t0, **self.system}
        lost = self.lost + self._stuck_entries(stuck) if stuck or self.stuck else self.lost
        if lost:
            snap["lost"] = lost
        if xids:
            snap["xid_events"] = xids
        host_ns = getattr(self.resolver, "host_namespace", None)
        if host_ns is not None:  # whether a pid missing from /proc is dead (sources/nvml/worker/processes.py)
            snap["host_pid_namespace"] = bool(host_ns)
        return snap

    def _lose(self, newly_lost: list[tuple[_Device, str]]) -> None:
        with self._lock:
            gone = {id(d) for d, _ in newly_lost}
            for d, _ in newly_lost:
                d.readings.close()
                if d.mig is not None:
                    d.mig.close()
            self.devices = [d for d in self.devices if id(d) not in gone]
            self.lost.extend({"index": d.index, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "reason": why}
                             for d, why in newly_lost)
            if self._polled and self.reenumerate is None:
                # Lost while we watched: re-enumerate. Lost already at the first poll: a fresh worker would see
                # the same, so keep polling the others instead of respawning in a loop.
                self.reenumerate = "gpu_lost: " + ",".join(d.uuid for d, _ in newly_lost)

    def _poll_mig(self, dev: _Device, gpu_out: dict[str, Any]
                  ) -> list[tuple[dict[str, Any], list[tuple[int, str, int | None]], Utilization | None]]:
        """The snapshot entries of a GPU's MIG devices (with their kept processes); notices a changed MIG
        configuration and asks for re-enumeration (sources/nvml/worker/mig.py)."""
        assert dev.mig is not None
        why = dev.mig.changed(gpu_out)
        entries = []
        for m in dev.mig.devices:
            out = m.identity(dev.uuid, dev.index)
            errors: dict[str, str] = {}
            m.readings.poll(out, errors)
            top = self._processes(m, out, errors)
            util = self._process_util(m, errors) if top else None
            if why is None:
                why = dev.mig.device_changed(m, out, errors)
            if errors:
                out["errors"] = errors
            entries.append((out, top, util))
        if why is not None and self.reenumerate is None:
            self.reenumerate = f"mig_config_changed: {dev.uuid}: {why}"
        return entries

    def _processes(
        self, dev: _Device | MigDevice, out: dict[str, Any], errors: dict[str, str]
    ) -> list[tuple[int, str, int | None]]:
        """Sets ``processes_total``; returns the top N (host facts are added for all GPUs at once)."""
        lists: list[list[tuple[int, int | None]] | None] = []
        for lister in dev.readings.process_listers:
            if lister.absent:
                lists.append(None)
                continue
            try:
                lists.append(lister(dev.handle))
            except N.NVMLError as e:
                if e.value in LOST_CODES:
                    raise NvmlGpuLost(e.value, lister.name) from None
                if e.value in ABSENT_CODES:
                    lister.absent = True  # learned once, like every other reading
                else:
                    errors[lister.name] = reason(e.value)
                lists.append(None)
        if lists[0] is None and lists[1] is None:
            return []  # no process reading at all: leave processes_total unknown
        merged = merge_processes(lists[0] or (), lists[1] or (), self.pid_limit)
        out["processes_total"] = len(merged)
        return top_processes(merged, self.top_n) if self.top_n and merged else []

    def _process_util(self, dev: _Device | MigDevice, errors: dict[str, str]) -> Utilization | None:
        """Per-process utilization since the previous read (None: absent or failed this poll)."""
        pu = dev.readings.process_util
        if pu.absent:
            return None
        try:
            return pu.read(dev.handle)
        except N.NVMLError as e:
            if e.value in LOST_CODES:
                raise NvmlGpuLost(e.value, "processes.utilization") from None
            if not pu.absent:
                errors["processes.utilization"] = reason(e.value)
            return None

    def _drain_events(self) -> list[dict[str, Any]]:
        if self.event_set is None:
            return []
        events: list[dict[str, Any]] = []
        now = time.time()
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = N.nvmlEventSetWait_v2(self.event_set, 0)
            except N.NVMLError as e:
                if e.value != TIMEOUT and e.value not in LOST_CODES:
                    worker_log(f"event wait: {reason(e.value)}", "WARNING")
                # GPU_IS_LOST has no device attribution here; the per-device calls tell which one.
                break
            if data.eventType & N.nvmlEventTypeXidCriticalError:
                uuid = self.by_addr.get(_addr(data.device))
                events.append({"uuid": uuid, "xid": int(data.eventData), "timestamp": now, "source": "nvml"})
        return events

    def _check_count(self) -> None:
        try:
            count = N.nvmlDeviceGetCount()
        except N.NVMLError:
            return
        if count != self.device_count and self.reenumerate is None:
            self.reenumerate = f"device_count_changed: {self.device_count} -> {count}"

    def close(self) -> None:
        for dev in self.devices:
            if dev.index not in self.stuck:  # a call blocked on it may still use its buffers
                dev.readings.close()
                if dev.mig is not None:
                    dev.mig.close()
        with contextlib.suppress(N.NVMLError):
            if self.event_set is not None:
                N.nvmlEventSetFree(self.event_set)
            N.nvmlShutdown()
