"""Supervises the NVML worker process: spawn, deadlines, kill, respawn with backoff.

NVML is never called in the daemon process (docs/architecture.md, "Processes"): a GPU that falls off the bus can
block an NVML call forever, and a blocked C call cannot be cancelled. The worker streams one JSON snapshot per
poll (:mod:`gpuwatchd.sources.nvml.protocol`) and sets aside a GPU whose calls block by itself, so the others keep
their schedule (:mod:`gpuwatchd.sources.nvml.worker.stall_watch`). Here: a snapshot that is late marks the data stale
at once (``on_late``); a worker silent for ``poll_timeout`` past a due snapshot failed as a whole (stuck outside GPU
calls, stopped, crashed): ``on_stale``, its process group gets SIGTERM, then SIGKILL after ``kill_grace``, and a
new worker is spawned after an exponential backoff. No GPU is blamed for that: a stopped or starved worker is not
a hung GPU. A worker that exits because a GPU was
lost or the device count changed, or a change in the set of NVIDIA PCI functions in sysfs
(:mod:`gpuwatchd.sources.nvml.hotplug`), gets a fresh worker at once: only a fresh NVML session re-enumerates reliably.

The parts: :mod:`~gpuwatchd.sources.nvml.worker_process` (the OS process), :mod:`~gpuwatchd.sources.nvml.stderr_relay`
(its log lines), :mod:`~gpuwatchd.sources.nvml.hang_log` (GPUs whose calls block),
:mod:`~gpuwatchd.sources.nvml.hotplug` (sysfs). This module is the loop that ties them together and reads the snapshots.

Logging: an operator reads one line per failure episode, not one per kill cycle. A GPU hang is logged by the
hang log; any other worker failure (crash, garbage, no start) is one WARNING while its reason stays the same,
and one INFO once a worker runs healthy again. An init failure (no driver) is logged by the daemon
(:mod:`gpuwatchd.runtime.nvml_outage`), so here it is DEBUG.

Timing: ``poll_interval`` and the backoff are scenario seconds (divided by ``clock.speed``, so
``gpuwatchd sim --speed X`` compresses them). Deadlines guard real processes on a possibly busy machine:
``poll_timeout`` is compressed too but never below ``min(poll_timeout, DEADLINE_FLOOR_SECONDS)`` of real time,
and ``kill_grace`` stays in real seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gpuwatchd.config.loader import NvmlConfig, ProcessesConfig, SysfsConfig
from gpuwatchd.model import LinkSample, Snapshot
from gpuwatchd.runtime.beat import Beat
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.runtime.waits import within
from gpuwatchd.sources.nvml import worker_process
from gpuwatchd.sources.nvml.hang_log import HangEpisode, HangLog
from gpuwatchd.sources.nvml.hang_retry import retry_worker
from gpuwatchd.sources.nvml.hotplug import SysfsWatch
from gpuwatchd.sources.nvml.intake import SnapshotIntake
from gpuwatchd.sources.nvml.protocol import (
    EXIT_REENUMERATE,
    GPM_MIN_SAMPLE_INTERVAL,
    HELLO,
    NOT_IN_A_GPU_CALL,
    PROGRESS_BYTES,
    RELEASE,
    SAME_AS_LAST,
    WORKER_MODULE,
    decode_progress,
    encode_line,
    encode_progress,
)
from gpuwatchd.sources.nvml.stderr_relay import StderrRelay

__all__ = ["HangEpisode", "NvmlSupervisor"]

log = logging.getLogger(__name__)

# Interpreter start + imports, before the worker says hello. Generous: a loaded 2-core box can take seconds;
# NVML init itself is timed separately, as part of the first poll's deadline.
STARTUP_TIMEOUT_SECONDS = 30.0
# Consecutive on-time snapshots after which the restart backoff starts again from its initial value.
HEALTHY_POLLS_TO_RESET_BACKOFF = 3
# Real seconds: a compressed poll_timeout (sim --speed) is never shorter than this (or poll_timeout itself, if less).
DEADLINE_FLOOR_SECONDS = 5.0
# Real seconds a GPU's calls may block before the worker sets it aside as suspected (at most the hang deadline).
STALL_AFTER_SECONDS = 0.25
# A snapshot is late (data marked stale) this long after it was due: half an interval, at least this many seconds.
LATE_FLOOR_SECONDS = 0.5
# Real seconds between retries of GPUs that hung, at least (restart_backoff_max compressed by sim --speed): each
# retry starts a Python process.
RETRY_FLOOR_SECONDS = 2.0


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
        on_links: Callable[[list[LinkSample]], object] | None = None,
        on_counters: Callable[[int, int], object] | None = None,
        on_late: Callable[[float], None] | None = None,
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
        self.on_late = on_late  # real seconds without a snapshot, once per late snapshot
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
        self.intake = SnapshotIntake(clock)
        self.hang_log = HangLog()
        self._stopping = False
        self._failing: str | None = None  # the reason of the failure episode logged at WARNING (not hangs)
        self._failures = 0  # failed workers in that episode
        self._stderr = StderrRelay()
        # Fired after each line reached on_snapshot: the sysfs watches ride on it (runtime/beat.py).
        self.beat = Beat()
        self._sysfs = SysfsWatch(lambda: self.sysfs.root, lambda: self._real(self.nvml.poll_interval),
                                 self.request_restart, on_links, beat=self.beat)
        self._last_line_at = 0.0  # loop time of the last stdout line from the current worker

    @property
    def hangs(self) -> dict[int, HangEpisode]:
        """index -> the hang episode being reported."""
        return self.hang_log.episodes

    # -- control ----------------------------------------------------------------------------------------------

    def _real(self, scenario_seconds: float) -> float:
        return scenario_seconds / self.clock.speed

    def _hang_after(self) -> float:
        """Real seconds: ``poll_timeout`` compressed by the clock's speed, with a floor (see the module doc)."""
        timeout = self.nvml.poll_timeout
        return max(self._real(timeout), min(timeout, DEADLINE_FLOOR_SECONDS))

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
        watcher = asyncio.create_task(self._sysfs.run(), name="nvml-sysfs-watch")
        retrier = asyncio.create_task(self._retry_hung(), name="nvml-hang-retry")
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
            for task in (watcher, retrier):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            proc = self._proc
            if proc is not None:
                await asyncio.shield(worker_process.terminate(proc, self.nvml.kill_grace))
            self._proc = None

    async def _retry_hung(self) -> None:
        """Every ``restart_backoff_max``: GPUs shown hung are tried by a short-lived retry worker, never by the
        worker that serves the others; the ones that answer are handed back to that worker (``release``)."""
        while True:
            await asyncio.sleep(max(self._real(self.nvml.restart_backoff_max), RETRY_FLOOR_SECONDS))
            hung = {i: ep.uuid for i, ep in self.hang_log.episodes.items() if ep.confirmed}
            if not hung or self._proc is None:
                continue
            back = await self._retry(hung)
            log.debug("retried GPU(s) %s that hung: %s", sorted(hung), f"{back} answer" if back else "still blocked")
            proc = self._proc
            if back and proc is not None and proc.stdin is not None:
                with contextlib.suppress(OSError, RuntimeError):  # the worker is ending: its successor starts clean
                    proc.stdin.write(encode_line({RELEASE: back}).encode())

    async def _retry(self, hung: dict[int, str | None]) -> list[int]:
        hang_after = self._hang_after()
        opts: dict[str, Any] = {"hang_after": hang_after, "stall_after": min(STALL_AFTER_SECONDS, hang_after)}
        lib = worker_process.library_file(self.nvml.library_path)
        if lib is not None:
            opts["library_path"] = str(lib)
        return await retry_worker(worker_process.worker_argv(self.python, self.worker_module), opts,
                                  worker_process.child_env(self.env, self.nvml.library_path), hung,
                                  start_timeout=STARTUP_TIMEOUT_SECONDS, kill_grace=self.nvml.kill_grace)

    def _worker_options(self, progress_fd: int) -> str:
        hang_after = self._hang_after()
        opts: dict[str, Any] = {"interval": self._real(self.nvml.poll_interval), "top_n": self.processes.top_n,
                                "progress_fd": progress_fd, "hang_after": hang_after,
                                "stall_after": min(STALL_AFTER_SECONDS, hang_after),
                                "gpm_min_interval": GPM_MIN_SAMPLE_INTERVAL,
                                # unchanged processes as bare pids: the intake's decoder keeps the last line's
                                SAME_AS_LAST: True}
        lib = worker_process.library_file(self.nvml.library_path)
        if lib is not None:
            opts["library_path"] = str(lib)
        return json.dumps(opts)

    async def _run_worker(self) -> tuple[int, bool]:
        """One worker's life. Returns (on-time snapshots delivered, whether it ended as a failure)."""
        self._sysfs.baseline()
        try:
            progress = os.memfd_create("gpuwatchd-nvml-progress")
        except OSError as e:  # EMFILE/ENFILE: out of descriptors is a failed start, retried with backoff
            self._stale(f"cannot start the NVML worker: {e.strerror or e}", "spawn_failed")
            return 0, True
        try:
            os.pwrite(progress, encode_progress(NOT_IN_A_GPU_CALL), 0)
            return await self._run_worker_with(progress)
        finally:
            os.close(progress)

    async def _run_worker_with(self, progress: int) -> tuple[int, bool]:
        argv = [*worker_process.worker_argv(self.python, self.worker_module), self._worker_options(progress)]
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
            interval = self._real(self.nvml.poll_interval)
            hang_after = self._hang_after()
            late_slack = max(interval / 2, LATE_FLOOR_SECONDS)
            self._last_line_at = loop.time()
            deadline = loop.time() + STARTUP_TIMEOUT_SECONDS
            late_at = math.inf  # until hello: interpreter start-up is not a late poll
            hello = False
            while True:
                try:
                    line = await within(min(deadline, late_at) - loop.time(), proc.stdout.readline)
                except asyncio.TimeoutError:
                    if self._restart_reason is not None or self._stopping:
                        break
                    if loop.time() < deadline:  # late, not yet failed: the values shown are being held
                        late_at = math.inf
                        self._late(loop.time() - self._last_line_at)
                        continue
                    self._timed_out(proc.pid, progress, "start" if not hello else "snapshot", hang_after)
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
                        deadline = now + hang_after
                        late_at = now + min(STALL_AFTER_SECONDS, hang_after) + late_slack
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
                self.beat.fire()
                deadline = now + interval + hang_after
                late_at = now + interval + late_slack
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

    def _late(self, silent: float) -> None:
        log.debug("NVML snapshot late: none for %.2fs; serving the last values marked stale", silent)
        if self.on_late is not None:
            self.on_late(silent)

    def _timed_out(self, pid: int, progress: int, waited: str, hang_after: float) -> None:
        """The worker as a whole missed its deadline. Nothing here points at one GPU (the worker sets aside a GPU
        whose calls block by itself), so no GPU is blamed: the worker is replaced."""
        if worker_process.is_stopped(pid):
            self._stale(f"the NVML worker is stopped (SIGSTOP or a debugger): no {waited} for more than "
                        f"{hang_after:.1f}s; replaced", "worker_stopped")
            return
        index = decode_progress(os.pread(progress, PROGRESS_BYTES, 0))
        where = " (outside GPU calls)" if waited != "start" else ""
        if index != NOT_IN_A_GPU_CALL:
            uuid = self.intake.known.get(index, (None, None))[0]
            where = f" (in a call on GPU {index}{' ' + uuid if uuid else ''})"
        self._stale(f"timeout: no {waited} from the NVML worker within its deadline{where}", "timeout")

    def _stale(self, message: str, error: str) -> None:
        self.last_error = error
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
        hang_after = self._hang_after()
        self.hang_log.observe(snap, asyncio.get_running_loop().time(), self.clock.speed,
                              min(STALL_AFTER_SECONDS, hang_after), hang_after)
        if self._failing is not None and delivered >= HEALTHY_POLLS_TO_RESET_BACKOFF:
            log.info("NVML data fresh again after %d failed worker(s) (last failure: %s)", self._failures,
                     self._failing)
            self._failing = None
            self._failures = 0

    def receive(self, msg: dict[str, Any]) -> Snapshot:
        """One decoded snapshot line through the intake (``msg`` is consumed); its GPUs' links are watched."""
        snap = self.intake.receive(msg)
        if snap.nvml_ok:
            self._sysfs.bus_ids = [g.pci_bus_id for g in snap.gpus if g.pci_bus_id]
        return snap
