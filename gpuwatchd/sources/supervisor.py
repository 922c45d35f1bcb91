"""Supervises the NVML worker process: spawn, deadline, kill, respawn with backoff.

NVML is never called in the daemon process (docs/architecture.md, "Processes"): a GPU that falls off the bus can
block an NVML call forever, and a blocked C call cannot be cancelled. The worker streams one JSON snapshot per
poll (:mod:`gpuwatchd.sources.worker_protocol`); a snapshot that does not arrive within ``poll_timeout`` after it
was due marks the data stale (``on_stale``), and the worker's process group gets SIGTERM, then SIGKILL after
``kill_grace``, and a new worker is spawned after an exponential backoff. A worker that exits because a GPU was
lost or the device count changed, or a change in the set of NVIDIA PCI functions in sysfs
(:mod:`gpuwatchd.sources.hotplug`), gets a fresh worker at once: only a fresh NVML session re-enumerates reliably.

The parts: :mod:`~gpuwatchd.sources.worker_process` (the OS process), :mod:`~gpuwatchd.sources.stderr_relay`
(its log lines), :mod:`~gpuwatchd.sources.quarantine` (GPUs whose calls hang), :mod:`~gpuwatchd.sources.hotplug`
(sysfs). This module is the loop that ties them together and reads the snapshots.

Logging: an operator reads one line per failure episode, not one per kill cycle. A hang is logged by the
quarantine; any other worker failure (crash, garbage, no start) is one WARNING while its reason stays the same,
and one INFO once a worker runs healthy again. An init failure (no driver) is logged by the daemon
(:mod:`gpuwatchd.runtime.nvml_outage`), so here it is DEBUG.

Timing: ``poll_interval`` and the backoff are scenario seconds (divided by ``clock.speed``, so
``gpuwatchd sim --speed X`` compresses them); ``kill_grace`` is about the OS and stays in real seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpuwatchd.config.loader import NvmlConfig, ProcessesConfig, SysfsConfig
from gpuwatchd.model import LinkSample, LostGpu, Snapshot, snapshot_from_dict
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sources import worker_process
from gpuwatchd.sources.hotplug import SysfsWatch
from gpuwatchd.sources.quarantine import HangEpisode, Quarantine
from gpuwatchd.sources.stderr_relay import StderrRelay
from gpuwatchd.sources.worker_protocol import (
    EXIT_REENUMERATE,
    HELLO,
    NOT_IN_A_GPU_CALL,
    WORKER_MODULE,
    decode_progress,
    encode_progress,
)

__all__ = ["HangEpisode", "NvmlSupervisor"]

log = logging.getLogger(__name__)

# Interpreter start + imports, before the worker says hello. Generous: a loaded 2-core box can take seconds;
# NVML init itself is timed separately, as part of the first poll's deadline.
STARTUP_TIMEOUT_SECONDS = 30.0
# Consecutive on-time snapshots after which the restart backoff starts again from its initial value.
HEALTHY_POLLS_TO_RESET_BACKOFF = 3


class NvmlSupervisor:
    """Runs the NVML worker and hands each snapshot (stamped with ``clock.now()``) to ``on_snapshot``."""

    def __init__(
        self,
        nvml: NvmlConfig,
        processes: ProcessesConfig,
        sysfs: SysfsConfig,
        *,
        clock: Clock,
        on_snapshot: Callable[[Snapshot], None],
        on_stale: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
        on_links: Callable[[list[LinkSample]], None] | None = None,
        on_counters: Callable[[int, int], None] | None = None,
        python: str = sys.executable,
        worker_module: str = WORKER_MODULE,
    ) -> None:
        self.nvml = nvml
        self.processes = processes
        self.sysfs = sysfs
        self.clock = clock
        self.on_snapshot = on_snapshot
        self.on_stale = on_stale
        self.on_counters = on_counters  # (restarts, init_failures), whenever one of them changes
        self.env = dict(os.environ if env is None else env)
        self.python = python
        self.worker_module = worker_module
        # workers replaced after a hang, crash or re-enumeration (gpuwatchd_nvml_worker_restarts_total)
        self.restarts = 0
        # Retries of an NVML init that failed (no driver, version mismatch): counted apart so a host without a
        # driver does not look like a crash-looping worker (gpuwatchd_nvml_init_failures_total).
        self.init_failures = 0
        self._init_failed = False
        self.last_error: str | None = None  # why the last worker ended badly / why NVML is down; None when healthy
        self.spawned = 0
        # Scenario seconds to wait before the next respawn after a failure: doubles per consecutive failure up to
        # restart_backoff_max (init retries go on forever at that pace), back to initial after a healthy run.
        self.backoff = nvml.restart_backoff_initial
        self._proc: asyncio.subprocess.Process | None = None
        self._restart_reason: str | None = None
        self._wake: asyncio.Event | None = None
        self._known: dict[int, tuple[str, str | None]] = {}  # index -> (uuid, bus id) from the last snapshot
        self.quarantine = Quarantine()
        self._stopping = False
        self._failing: str | None = None  # the reason of the failure episode logged at WARNING (not hangs)
        self._failures = 0  # failed workers in that episode
        self._stderr = StderrRelay()
        self._sysfs = SysfsWatch(lambda: self.sysfs.root, lambda: self._real(self.nvml.poll_interval),
                                 self.request_restart, on_links)
        self._last_line_at = 0.0  # loop time of the last stdout line from the current worker

    @property
    def hangs(self) -> dict[int, HangEpisode]:
        """index -> the hang episode being reported."""
        return self.quarantine.hangs

    # -- control ----------------------------------------------------------------------------------------------

    def _real(self, scenario_seconds: float) -> float:
        return scenario_seconds / self.clock.speed

    def request_restart(self, reason: str) -> None:
        """Replace the worker now (no backoff): re-enumeration after hot-plug, reconfiguration."""
        self._restart(reason, logging.INFO)

    def _restart(self, reason: str, level: int) -> None:
        log.log(level, "NVML worker restart requested: %s", reason)
        self._restart_reason = reason
        if self._wake is not None:
            self._wake.set()
        worker_process.signal_group(self._proc, signal.SIGTERM)

    def reconfigure(self, nvml: NvmlConfig, processes: ProcessesConfig, sysfs: SysfsConfig) -> None:
        """Apply a reloaded config (SIGHUP); the worker is replaced when something it uses changed."""
        changed = nvml != self.nvml or processes != self.processes
        self.nvml, self.processes, self.sysfs = nvml, processes, sysfs
        if changed:
            self.request_restart("reconfigure")

    async def stop(self) -> None:
        """Stop the worker (TERM, then KILL) and make ``run`` return."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._proc is not None:
            await worker_process.terminate(self._proc, self.nvml.kill_grace)

    # -- main loop --------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Supervise until cancelled or stopped."""
        self._wake = asyncio.Event()
        watcher = asyncio.create_task(self._sysfs.run(self._retry_due), name="nvml-sysfs-watch")
        self.backoff = self.nvml.restart_backoff_initial
        try:
            while not self._stopping:
                healthy, failed = await self._run_worker()
                if self._stopping:
                    break
                if healthy >= HEALTHY_POLLS_TO_RESET_BACKOFF:
                    self.backoff = self.nvml.restart_backoff_initial
                delay = 0.0
                if self._restart_reason is None and failed:
                    delay = self.backoff
                    self.backoff = min(max(self.backoff * 2, self.nvml.restart_backoff_initial),
                                       self.nvml.restart_backoff_max)
                self._restart_reason = None
                if delay > 0:
                    self._wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self._real(delay))
                if self._init_failed:
                    self.init_failures += 1
                else:
                    self.restarts += 1
                if self.on_counters is not None:
                    self.on_counters(self.restarts, self.init_failures)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            proc = self._proc
            if proc is not None:
                await asyncio.shield(worker_process.terminate(proc, self.nvml.kill_grace))
            self._proc = None

    def _retry_due(self) -> None:
        if self._proc is None:
            return
        due = self.quarantine.due(asyncio.get_running_loop().time(), self._real(self.nvml.restart_backoff_max))
        if due:
            # DEBUG: part of a hang episode, which is logged once (see Quarantine.hang)
            self._restart(f"retrying GPU(s) {due} that hung", logging.DEBUG)

    def _worker_options(self, progress_fd: int) -> str:
        opts: dict[str, Any] = {"interval": self._real(self.nvml.poll_interval), "top_n": self.processes.top_n,
                                "progress_fd": progress_fd}
        skip = self.quarantine.skip(asyncio.get_running_loop().time(), self._real(self.nvml.restart_backoff_max))
        if skip:
            opts["skip"] = skip
        lib = worker_process.library_file(self.nvml.library_path)
        if lib is not None:
            opts["library_path"] = str(lib)
        return json.dumps(opts)

    async def _run_worker(self) -> tuple[int, bool]:
        """One worker's life. Returns (on-time snapshots delivered, whether it ended as a failure)."""
        self._sysfs.baseline()
        progress = os.memfd_create("gpuwatchd-nvml-progress")
        try:
            os.pwrite(progress, encode_progress(NOT_IN_A_GPU_CALL), 0)
            return await self._run_worker_with(progress)
        finally:
            os.close(progress)

    async def _run_worker_with(self, progress: int) -> tuple[int, bool]:
        argv = [self.python, "-m", self.worker_module, self._worker_options(progress)]
        try:
            proc = await worker_process.spawn(argv, worker_process.child_env(self.env, self.nvml.library_path),
                                              pass_fds=(progress,))
        except OSError as e:  # fork/exec failed (EAGAIN, ENOMEM, a bad interpreter path)
            self._stale(f"cannot start the NVML worker: {e.strerror or e}", "spawn_failed")
            return 0, True
        self._proc = proc
        self.spawned += 1
        self._stderr.next_worker()
        if self._stopping:  # stop() ran while we were spawning
            worker_process.signal_group(proc, signal.SIGTERM)
        assert proc.stdout is not None and proc.stderr is not None
        relay = asyncio.create_task(self._stderr.relay(proc.stderr, proc.pid), name="nvml-worker-stderr")
        delivered = 0
        failed = False
        init_failed = False
        try:
            loop = asyncio.get_running_loop()
            self._last_line_at = loop.time()
            deadline = loop.time() + STARTUP_TIMEOUT_SECONDS
            hello = False
            while True:
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    if self._restart_reason is not None or self._stopping:
                        break
                    waited = "start" if not hello else "snapshot"
                    index, where = self._quarantine_stuck(progress)
                    self._stale(f"timeout: no {waited} from the NVML worker within its deadline{where}", "timeout",
                                hung=index)
                    failed = True
                    break
                except ValueError:  # line longer than MAX_LINE_BYTES
                    self._stale("worker wrote an oversized line", "protocol_error")
                    failed = True
                    break
                if not line:
                    break  # EOF: the worker exited; its code says why
                now = loop.time()
                self._last_line_at = now
                try:
                    msg = json.loads(line)
                    if HELLO in msg:
                        hello = True
                        deadline = now + self._real(self.nvml.poll_timeout)
                        continue
                    snap = self.receive(msg)
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    # A worker of another version or a corrupted pipe: replace it rather than guess.
                    self._stale(f"unreadable line from the NVML worker: {e!r}"[:300], "protocol_error")
                    failed = True
                    break
                if not snap.nvml_ok:
                    init_failed = True
                    self.last_error = snap.nvml_error or "unknown"
                    # The daemon logs the outage once (gpuwatchd.runtime.nvml_outage); every retry is DEBUG here.
                    log.debug("NVML unavailable: %s (worker %d)", self.last_error, proc.pid)
                else:
                    delivered += 1
                    self.last_error = None
                    self._healthy(snap, delivered)
                self.on_snapshot(snap)
                deadline = now + self._real(self.nvml.poll_interval + self.nvml.poll_timeout)
        finally:
            await worker_process.terminate(proc, self.nvml.kill_grace)
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(relay, self.nvml.kill_grace + 1.0)
            self._proc = None
        code = proc.returncode
        self._init_failed = init_failed and not failed
        if failed or init_failed:
            return delivered, True
        if code == EXIT_REENUMERATE or self._restart_reason is not None or self._stopping:
            return delivered, False
        why = f"worker_exit_{code}" if code is not None and code >= 0 else f"worker_signal_{-(code or 0)}"
        said = f": {self._stderr.last_words}" if self._stderr.last_words else ""
        self._stale(f"NVML worker exited unexpectedly ({why}){said}"[:500], why)
        return delivered, True

    def _quarantine_stuck(self, progress: int) -> tuple[int | None, str]:
        """Which GPU the worker was calling when it missed its deadline; that GPU is left out of the next ones."""
        index = decode_progress(os.pread(progress, 4, 0))
        if index < 0:
            return None, ""
        uuid, bus = self._known.get(index, (None, None))
        self.quarantine.set_aside(index, uuid, bus, asyncio.get_running_loop().time())
        return index, f" (stuck in a call on GPU {index}{' ' + uuid if uuid else ''})"

    def _stale(self, message: str, error: str, *, hung: int | None = None) -> None:
        self.last_error = error
        if hung is not None:
            self.quarantine.hang(hung, self._known.get(hung, (None, None))[0], last_heard=self._last_line_at,
                                 now=asyncio.get_running_loop().time(), speed=self.clock.speed,
                                 retry=self.nvml.restart_backoff_max)
        else:
            self._failures += 1
            if error != self._failing:
                log.warning("NVML data stale: %s", message)
                self._failing = error
            else:
                log.debug("NVML data stale again (%d failed workers): %s", self._failures, message)
        if self.on_stale is not None:
            self.on_stale(message)

    def _healthy(self, snap: Snapshot, delivered: int) -> None:
        """A good snapshot: end the hang episodes of GPUs that answer again, and a failure episode after a run."""
        self.quarantine.answered(snap, asyncio.get_running_loop().time(), self.clock.speed)
        if self._failing is not None and delivered >= HEALTHY_POLLS_TO_RESET_BACKOFF:
            log.info("NVML data fresh again after %d failed worker(s) (last failure: %s)", self._failures,
                     self._failing)
            self._failing = None
            self._failures = 0

    def receive(self, msg: dict[str, Any]) -> Snapshot:
        """The intake of one decoded snapshot line: stamped with the daemon's clock, GPUs lost at enumeration
        named from what earlier workers saw (``msg`` is consumed)."""
        msg.pop("calls", None)
        msg["timestamp"] = self.clock.now()
        # Xid events drained by this poll are stamped on the daemon's clock too: the worker's wall time is not the
        # rules' time under `sim --speed` (the Xid rule would count them stale), and they are at most a poll old.
        for ev in msg.get("xid_events") or ():
            ev["timestamp"] = msg["timestamp"]
        snap = snapshot_from_dict(msg)
        if snap.lost and any(lost.uuid is None for lost in snap.lost):
            snap = replace(snap, lost=tuple(self._identify(lost) for lost in snap.lost))
        if snap.nvml_ok:
            # Merge, not replace: a GPU lost at enumeration keeps the identity its index had before.
            for g in snap.gpus:
                self._known[g.index] = (g.uuid, g.pci_bus_id)
            self._sysfs.bus_ids = [g.pci_bus_id for g in snap.gpus if g.pci_bus_id]
        return snap

    def _identify(self, lost: LostGpu) -> LostGpu:
        """A GPU lost at enumeration answers nothing, not even its UUID: name it from what the last worker saw."""
        if lost.uuid is not None:
            return lost
        known = self._known.get(lost.index)
        if known is None or (lost.pci_bus_id is not None and known[1] != lost.pci_bus_id):
            return lost
        return replace(lost, uuid=known[0], pci_bus_id=known[1])
