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
can tell which GPU hung), ``skip`` ({index: {"uuid", "pci_bus_id"}}: GPUs not to touch, reported lost with
reason ``timeout``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import signal
import sys
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
from gpuwatchd.sources.worker_protocol import (
    EXIT_INIT_FAILED,
    EXIT_REENUMERATE,
    EXIT_STOPPED,
    HELLO,
    NOT_IN_A_GPU_CALL,
    PROGRESS_BYTES,
    encode_line,
    encode_progress,
)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
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
    """One NVML session: enumeration at start, then ``poll()`` repeatedly."""

    def __init__(self, top_n: int, resolver: Resolver | None, *, skip: dict[int, dict[str, Any]] | None = None,
                 progress_fd: int | None = None) -> None:
        self.top_n = top_n
        self.skip = skip or {}  # index -> {"uuid", "pci_bus_id"}: GPUs whose calls hung in an earlier worker
        # One int32 the supervisor reads after a missed deadline: the index of the GPU being called (-1: none).
        self._progress = mmap.mmap(progress_fd, PROGRESS_BYTES) if progress_fd is not None else None
        self.resolver = resolver
        self.pid_limit = pid_max()
        self.devices: list[_Device] = []
        self.lost: list[dict[str, Any]] = []
        self.initial_lost = 0
        self.device_count = 0
        self.system: dict[str, Any] = {}
        self.event_set: Any = None
        self.by_addr: dict[int | None, str] = {}
        self.reenumerate: str | None = None  # why this worker should be replaced after the current snapshot
        self._polled = False

    # -- start ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """nvmlInit (no-GPU flag: a driver without GPUs is "up with 0 GPUs"), system facts, enumeration, events."""
        N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
        for key, fn in (
            ("driver_version", N.nvmlSystemGetDriverVersion),
            ("nvml_version", N.nvmlSystemGetNVMLVersion),
            ("cuda_driver_version", N.nvmlSystemGetCudaDriverVersion),
        ):
            with contextlib.suppress(N.NVMLError):
                self.system[key] = fn()
        self.device_count = N.nvmlDeviceGetCount()
        for i in range(self.device_count):
            if i in self.skip:
                # Not touched at all: with a hung driver even the UUID lookup blocks. Reported, not polled.
                self.lost.append({"index": i, **self.skip[i], "reason": "timeout"})
                continue
            self._at(i)
            try:
                dev = _Device(i, N.nvmlDeviceGetHandleByIndex(i))
            except N.NVMLError as e:
                # Listed but unusable (lost, no permission, ...): report it and poll the others.
                self.lost.append({"index": i, "reason": reason(e.value)})
                continue
            self.devices.append(dev)
            self.by_addr[dev.addr] = dev.uuid
        self._register_events()
        self._at(NOT_IN_A_GPU_CALL)

    def _at(self, index: int) -> None:
        if self._progress is not None:
            self._progress[:PROGRESS_BYTES] = encode_progress(index)

    def _register_events(self) -> None:
        try:
            self.event_set = N.nvmlEventSetCreate()
        except N.NVMLError as e:
            worker_log(f"no NVML events: {reason(e.value)}")
            return
        for dev in self.devices:
            self._at(dev.index)
            try:
                mask = N.nvmlEventTypeXidCriticalError & N.nvmlDeviceGetSupportedEventTypes(dev.handle)
                if mask:
                    N.nvmlDeviceRegisterEvents(dev.handle, mask, self.event_set)
            except N.NVMLError as e:
                # NOT_SUPPORTED means "no Xid events for this GPU", not unhealthy (k8s-device-plugin#1562).
                if e.value not in ABSENT_CODES:
                    worker_log(f"GPU {dev.uuid}: Xid events not registered: {reason(e.value)}", "WARNING")

    # -- poll -------------------------------------------------------------------------------------------------

    def poll(self) -> dict[str, Any]:
        """One snapshot (pipe encoding); sets ``reenumerate`` when a fresh worker is needed afterwards."""
        t0 = time.monotonic()
        gpus = []
        newly_lost = []
        # (GPU's out dict, kept processes): host facts are resolved once for all GPUs after the loop
        kept: list[tuple[dict[str, Any], list[tuple[int, str, int | None]]]] = []
        at = self._at
        for dev in self.devices:
            at(dev.index)
            out: dict[str, Any] = {"uuid": dev.uuid, "index": dev.index, "name": dev.name,
                                   "pci_bus_id": dev.pci_bus_id, "serial": dev.serial}
            errors: dict[str, str] = {}
            try:
                dev.readings.poll(out, errors)
                top = self._processes(dev, out, errors)
            except NvmlGpuLost as e:
                newly_lost.append(dev)
                self.lost.append({"index": dev.index, "uuid": dev.uuid, "pci_bus_id": dev.pci_bus_id,
                                  "reason": e.reason})
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
            lost_ids = {id(d) for d in newly_lost}
            self.devices = [d for d in self.devices if id(d) not in lost_ids]
            if self._polled:
                # Lost while we watched: re-enumerate. Lost already at the first poll: a fresh worker would see
                # the same, so keep polling the others instead of respawning in a loop.
                self.reenumerate = "gpu_lost: " + ",".join(d.uuid for d in newly_lost)
        at(NOT_IN_A_GPU_CALL)
        xids = self._drain_events()
        self._check_count()
        self._polled = True
        snap: dict[str, Any] = {"timestamp": time.time(), "nvml_ok": True, "device_count": self.device_count,
                                "gpus": gpus, "poll_duration_seconds": time.monotonic() - t0, **self.system}
        if self.lost:
            snap["lost"] = self.lost
        if xids:
            snap["xid_events"] = xids
        return snap

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


def run(opts: dict[str, Any], resolver: Resolver) -> int:
    """Worker main loop; returns the exit code."""
    interval = float(opts.get("interval", 1.0))
    max_polls = opts.get("max_polls")
    counter = _CallCounter() if opts.get("trace_calls") else None
    parent = os.getppid()
    _emit({HELLO: os.getpid()})
    skip = {int(k): v for k, v in (opts.get("skip") or {}).items()}
    worker = Worker(int(opts.get("top_n", 10)), resolver, skip=skip, progress_fd=opts.get("progress_fd"))
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
    polls = 0
    # Off (None) in the daemon: one comparison per poll. CPU time of this process only, precise (not tick-based).
    measure_after: int | None = opts.get("measure_after")
    cpu0 = 0.0
    while True:
        if polls == measure_after:
            cpu0 = time.process_time()
        started = time.monotonic()
        snap = worker.poll()
        if counter is not None:
            snap["calls"] = counter.take()
        _emit(snap)
        polls += 1
        if worker.reenumerate is not None:
            worker_log(f"exiting for a fresh enumeration: {worker.reenumerate}")
            worker.close()
            return EXIT_REENUMERATE
        if max_polls is not None and polls >= max_polls:
            if measure_after is not None:
                cpu = time.process_time() - cpu0
                worker_log(f"measured cpu_seconds={cpu:.9f} polls={polls - measure_after}", "DEBUG")
            worker.close()
            return EXIT_STOPPED
        if os.getppid() != parent:
            worker.close()
            return EXIT_STOPPED
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


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
