"""The NVML worker: ``python -m gpuwatchd.sources.nvml_worker '<json options>'``, supervised by the daemon.

The only module (with its ``nvml_*`` helpers) that imports pynvml. It initialises NVML, enumerates GPUs by index
(keyed by UUID downstream), then polls every ``interval`` seconds and writes one JSON line per poll to stdout:
the ``Snapshot`` dict form (the supervisor reads it with ``snapshot_from_dict``).
The first line is ``{"hello": <pid>}``, written before ``nvmlInit`` so the supervisor can time init as part of
the first poll. Logs go to stderr as ``nvml_worker[<pid>] <LEVEL>: <message>`` lines.

Host facts about GPU processes (name, user, RSS) come from psutil; ``main(resolver=...)`` takes another source
(``gpuwatchd.sim.worker`` passes the simulator's, whose pids are fictitious).

Lines, exit codes and the progress word are defined in :mod:`gpuwatchd.sources.worker_protocol`. A GPU lost or a
changed device count ends the worker with ``EXIT_REENUMERATE``: a long-lived NVML session does not see hot-plug,
so a fresh worker re-enumerates.

Options (JSON object on argv[1]): ``interval`` (real seconds between poll starts), ``top_n`` (processes kept
per GPU), ``library_path`` (the library the supervisor pointed ``LD_LIBRARY_PATH`` at; missing means
``library_not_found``), ``max_polls`` (stop after this many; for tests and bench/poll.py), ``trace_calls``
(count NVML symbol look-ups per poll and add ``"calls"`` to each line; for tests of the capability cache),
``measure_after`` (bench/poll.py: after this many polls, start counting the worker's own CPU time with
``time.process_time()``; at ``max_polls`` log ``measured cpu_seconds=<s> polls=<n>`` at DEBUG),
``progress_fd`` (an inherited 4-byte memfd where the index of the GPU being called is kept, so the supervisor
can say where a worker that missed its deadline was), ``stall_after`` and ``hang_after`` (real seconds: a GPU
whose calls block this long is set aside, reported lost as ``hang_suspected`` and then as ``timeout``, while the
other GPUs keep their schedule; :mod:`gpuwatchd.sources.stall_watch`), ``only`` (GPU indices: open just these,
for the supervisor's retry of GPUs that hung). Commands come on stdin (``worker_protocol``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as N

from gpuwatchd.sources.errors import ABSENT_CODES, LOST_CODES, TIMEOUT, NvmlGpuLost, reason
from gpuwatchd.sources.nvml_readings import DeviceReadings, worker_log
from gpuwatchd.sources.processes import (
    PsutilResolver,
    Resolver,
    merge_processes,
    pid_max,
    process_dicts_per_gpu,
    top_processes,
)
from gpuwatchd.sources.stall_watch import Position, Stuck, watch
from gpuwatchd.sources.worker_protocol import (
    EXIT_INIT_FAILED,
    EXIT_REENUMERATE,
    EXIT_STOPPED,
    HANG_SUSPECTED,
    HELLO,
    HUNG,
    NOT_IN_A_GPU_CALL,
    PROGRESS_BYTES,
    RELEASE,
    encode_line,
    encode_progress,
)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# When the supervisor does not say (tests, bench): a GPU whose call blocks this long (real seconds) is set aside
# as suspected, and reported hung after DEFAULT_HANG_AFTER_SECONDS (nvml.poll_timeout's default).
DEFAULT_STALL_AFTER_SECONDS = 0.25
DEFAULT_HANG_AFTER_SECONDS = 5.0
# Bound on Xid events drained per poll so an event storm cannot starve the poll; the rest wait for the next one.
MAX_EVENTS_PER_POLL = 256


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when the daemon dies, even while blocked inside a hung NVML call."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(encode_line(obj))
    sys.stdout.flush()


def _addr(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class _Device:
    __slots__ = ("addr", "handle", "index", "name", "pci_bus_id", "readings", "serial", "uuid")

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.addr = _addr(handle)
        self.uuid: str = N.nvmlDeviceGetUUID(handle)
        self.name: str | None = _optional(N.nvmlDeviceGetName, handle)
        pci = _optional(N.nvmlDeviceGetPciInfo, handle)
        self.pci_bus_id: str | None = pci.busId if pci is not None else None
        self.serial: str | None = _optional(N.nvmlDeviceGetSerial, handle)
        self.readings = DeviceReadings(handle)


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

    Poller threads share it (:mod:`gpuwatchd.sources.stall_watch`): each passes its own :class:`Position`, and a
    thread whose generation is no longer current stops at its next step without emitting anything.
    """

    def __init__(self, top_n: int, resolver: Resolver | None, *, progress_fd: int | None = None,
                 hang_after: float = DEFAULT_HANG_AFTER_SECONDS, only: set[int] | None = None) -> None:
        self.top_n = top_n
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
                if self._reopen:
                    i = self._reopen.pop(0)
                elif self._next_index < self.device_count:
                    i = self._next_index
                    self._next_index += 1
                else:
                    return True
            if self.only is not None and i not in self.only:
                continue
            self._at(pos, i)
            try:
                dev: _Device | None = _Device(i, N.nvmlDeviceGetHandleByIndex(i))
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

    def enumerated(self) -> bool:
        return not self._reopen and self._next_index >= self.device_count

    def _at(self, pos: Position, index: int) -> None:
        pos.index = index
        pos.seq += 1
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

    def _answered(self, pos: Position, index: int) -> None:
        """An abandoned poller is back from its call on GPU ``index``: poll that GPU again."""
        with self._lock:
            st = self.stuck.get(index)
            if st is not None and st.pos is pos:
                del self.stuck[index]

    def _stuck_entries(self) -> list[dict[str, Any]]:
        return [{"index": st.index, "uuid": st.uuid, "pci_bus_id": st.pci_bus_id,
                 "reason": HUNG if st.blocked >= self.hang_after else HANG_SUSPECTED}
                for st in sorted(self.stuck.values(), key=lambda st: st.index)]

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
        at = self._at
        stuck = self.stuck
        for dev in self.devices:
            if stuck and dev.index in stuck:
                continue
            at(pos, dev.index)
            out: dict[str, Any] = {"uuid": dev.uuid, "index": dev.index, "name": dev.name,
                                   "pci_bus_id": dev.pci_bus_id, "serial": dev.serial}
            errors: dict[str, str] = {}
            try:
                dev.readings.poll(out, errors)
                top = self._processes(dev, out, errors)
            except NvmlGpuLost as e:
                newly_lost.append((dev, e.reason))
                top = []
            if pos.gen != self.gen:  # set aside during this GPU's calls, which have now returned
                self._answered(pos, dev.index)
                if newly_lost:
                    self._lose(newly_lost)
                return None
            if newly_lost and newly_lost[-1][0] is dev:
                continue
            if errors:
                out["errors"] = errors
            if top:
                kept.append((out, top))
            gpus.append(out)
        if kept:
            for (out, _), procs in zip(kept, process_dicts_per_gpu([t for _, t in kept], self.resolver), strict=True):
                out["processes"] = procs
        if newly_lost:
            self._lose(newly_lost)
        at(pos, NOT_IN_A_GPU_CALL)
        xids = self._drain_events()
        self._check_count()
        self._polled = True
        snap: dict[str, Any] = {"timestamp": time.time(), "nvml_ok": True, "device_count": self.device_count,
                                "gpus": gpus, "poll_duration_seconds": time.monotonic() - t0, **self.system}
        lost = self.lost + self._stuck_entries() if stuck else self.lost
        if lost:
            snap["lost"] = lost
        if xids:
            snap["xid_events"] = xids
        return snap

    def _lose(self, newly_lost: list[tuple[_Device, str]]) -> None:
        with self._lock:
            gone = {id(d) for d, _ in newly_lost}
            self.devices = [d for d in self.devices if id(d) not in gone]
            self.lost.extend({"index": d.index, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "reason": why}
                             for d, why in newly_lost)
            if self._polled and self.reenumerate is None:
                # Lost while we watched: re-enumerate. Lost already at the first poll: a fresh worker would see
                # the same, so keep polling the others instead of respawning in a loop.
                self.reenumerate = "gpu_lost: " + ",".join(d.uuid for d, _ in newly_lost)

    def _processes(
        self, dev: _Device, out: dict[str, Any], errors: dict[str, str]
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
        with contextlib.suppress(N.NVMLError):
            if self.event_set is not None:
                N.nvmlEventSetFree(self.event_set)
            N.nvmlShutdown()


class _CallCounter:
    """Counts NVML symbol look-ups (one per pynvml call) by wrapping pynvml's own pointer accessor."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._orig = N._nvmlGetFunctionPointer
        N._nvmlGetFunctionPointer = self._lookup

    def _lookup(self, name: str) -> Any:
        self.counts[name] = self.counts.get(name, 0) + 1
        return self._orig(name)

    def take(self) -> dict[str, int]:
        out, self.counts = self.counts, {}
        return out


class _Runner:
    """The poll schedule, shared by the poller threads (one current generation at a time), and the exit code."""

    def __init__(self, worker: Worker, opts: dict[str, Any], counter: _CallCounter | None) -> None:
        self.worker = worker
        self.interval = float(opts.get("interval", 1.0))
        self.max_polls: int | None = opts.get("max_polls")
        # Off (None) in the daemon: one comparison per poll. CPU time of this process, precise (not tick-based).
        self.measure_after: int | None = opts.get("measure_after")
        self.counter = counter
        self.parent = os.getppid()
        self.polls = 0
        self.cpu0 = 0.0
        self.done = threading.Event()
        self.code = EXIT_STOPPED
        self._emit_lock = threading.Lock()

    def start(self, pos: Position) -> None:
        threading.Thread(target=self.loop, args=(pos,), name=f"poller-{pos.gen}", daemon=True).start()

    def loop(self, pos: Position) -> None:
        worker = self.worker
        while True:
            if self.polls == self.measure_after:
                self.cpu0 = time.process_time()
            started = time.monotonic()
            snap = worker.poll(pos)
            if snap is None:
                return  # set aside: the current poller carries on
            if self.counter is not None:
                snap["calls"] = self.counter.take()
            with self._emit_lock:
                if pos.gen != worker.gen:
                    return
                _emit(snap)
                self.polls += 1
            code = self._after_poll()
            if code is not None:
                self.code = code
                self.done.set()
                return
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))
            if pos.gen != worker.gen:
                return

    def _after_poll(self) -> int | None:
        if self.worker.reenumerate is not None:
            worker_log(f"exiting for a fresh enumeration: {self.worker.reenumerate}")
            return EXIT_REENUMERATE
        if self.max_polls is not None and self.polls >= self.max_polls:
            if self.measure_after is not None:
                cpu = time.process_time() - self.cpu0
                worker_log(f"measured cpu_seconds={cpu:.9f} polls={self.polls - self.measure_after}", "DEBUG")
            return EXIT_STOPPED
        if os.getppid() != self.parent:
            return EXIT_STOPPED
        return None

    def set_aside(self, pos: Position, blocked: float) -> None:
        new = self.worker.set_aside(pos, blocked)
        if new is not None:
            self.start(new)


def _read_commands(worker: Worker) -> None:
    """The supervisor's lines on stdin (worker_protocol); EOF or garbage ends the reading, not the worker."""
    try:
        for line in sys.stdin:
            for index in json.loads(line).get(RELEASE, ()):
                worker.release(int(index))
    except (ValueError, TypeError, AttributeError, OSError) as e:
        worker_log(f"unreadable command from the supervisor: {e!r}", "WARNING")


def run(opts: dict[str, Any], resolver: Resolver) -> int:
    """Worker main: init, then polls in a poller thread while this thread watches for blocked calls."""
    counter = _CallCounter() if opts.get("trace_calls") else None
    _emit({HELLO: os.getpid()})
    hang_after = float(opts.get("hang_after", DEFAULT_HANG_AFTER_SECONDS))
    stall_after = min(float(opts.get("stall_after", DEFAULT_STALL_AFTER_SECONDS)), hang_after)
    only = {int(i) for i in opts["only"]} if opts.get("only") is not None else None
    worker = Worker(int(opts.get("top_n", 10)), resolver, progress_fd=opts.get("progress_fd"), hang_after=hang_after,
                    only=only)
    library = opts.get("library_path")
    try:
        if library is not None and not os.path.exists(library):
            # A configured library that is missing must not silently fall back to whatever the system has.
            raise N.NVMLError(N.NVML_ERROR_LIBRARY_NOT_FOUND)
        worker.start()
    except N.NVMLError as e:
        why = reason(e.value)
        # DEBUG: the daemon reports an outage once (gpuwatchd.runtime.nvml_outage), not once per retry.
        worker_log(f"nvmlInit failed: {why} ({e}){f' [{library}]' if library else ''}", "DEBUG")
        _emit({"timestamp": time.time(), "nvml_ok": False, "nvml_error": why})
        return EXIT_INIT_FAILED
    runner = _Runner(worker, opts, counter)
    threading.Thread(target=_read_commands, args=(worker,), name="commands", daemon=True).start()
    runner.start(worker.pos)
    watch(lambda: worker.pos, lambda: worker.stuck, runner.set_aside, runner.done, stall_after)
    if worker.stuck:
        # A thread is still inside a blocked NVML call: nvmlShutdown could block behind it, and interpreter
        # shutdown would wait on nothing useful. The snapshot lines are flushed; leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(runner.code)
    worker.close()
    return runner.code


def main(argv: list[str] | None = None, resolver: Callable[[], Resolver] = PsutilResolver) -> int:
    """``python -m gpuwatchd.sources.nvml_worker '<json options>'``; ``resolver`` makes the host-facts source."""
    argv = sys.argv[1:] if argv is None else argv
    opts = json.loads(argv[0]) if argv else {}
    _die_with_parent()
    # SIGPIPE default: the daemon closing our stdout ends us quietly instead of a BrokenPipeError traceback.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return run(opts, resolver())


if __name__ == "__main__":
    sys.exit(main())
