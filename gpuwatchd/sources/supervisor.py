"""Supervises the NVML worker process: spawn, deadline, kill, respawn with backoff, hot-plug watch.

NVML is never called in the daemon process (architecture.md, "Process model"): a GPU that falls off the bus can
block an NVML call forever, and a blocked C call cannot be cancelled. The worker streams one JSON snapshot per
poll; a snapshot that does not arrive within ``poll_timeout`` after it was due marks the data stale
(``on_stale``), and the worker's process group gets SIGTERM, then SIGKILL after ``kill_grace``, and a new worker
is spawned after an exponential backoff. A worker that exits because a GPU was lost or the device count changed,
or a change in the set of NVIDIA PCI functions in sysfs (Thunderbolt detach, hot-add), gets a fresh worker at
once: only a fresh NVML session re-enumerates reliably (nvml-egpu.md §3.3).

Logging: an operator reads one line per failure episode, not one per kill cycle. A hang is one WARNING naming
the GPU and how long it had not answered, repeats at DEBUG, and one INFO when that GPU answers again; any other
worker failure (crash, garbage, no start) is one WARNING while its reason stays the same, and one INFO once a
worker runs healthy again. An init failure (no driver) is logged by the daemon (:mod:`gpuwatchd.runtime.nvml_outage`),
so here it is DEBUG. The worker's stderr lines carry a level (``nvml_worker[pid] LEVEL: ...``); a line this
worker or the previous one already wrote is relayed at DEBUG, and output without that prefix (a Python traceback,
a message from a C library) is relayed as one WARNING block whose last line also goes into the exit message.

Timing: ``poll_interval``, ``poll_timeout`` and the backoff are scenario seconds (divided by ``clock.speed``, so
``gpuwatchd sim --speed X`` compresses them); ``kill_grace`` is about the OS and stays in real seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuwatchd.config.loader import NvmlConfig, ProcessesConfig, SysfsConfig
from gpuwatchd.model import LinkSample, LostGpu, Snapshot, snapshot_from_dict
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sources.sysfs_pcie import nvidia_devices, read_links

log = logging.getLogger(__name__)

WORKER_MODULE = "gpuwatchd.sources.nvml_worker"
LIBRARY_NAME = "libnvidia-ml.so.1"
# Interpreter start + imports, before the worker says hello. Generous: a loaded 2-core box can take seconds;
# NVML init itself is timed separately, as part of the first poll's deadline.
STARTUP_TIMEOUT_SECONDS = 30.0
# One JSON line per poll; 16 GPUs x top-1000 processes is a few MB. Bigger means a broken worker.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Consecutive on-time snapshots after which the restart backoff starts again from its initial value.
HEALTHY_POLLS_TO_RESET_BACKOFF = 3
# Floor of the sysfs hot-plug scan period (real seconds): with ``sim --speed 60`` the poll interval is ~17 ms,
# and a directory scan at that rate would cost the event loop more than hot-plug detection is worth.
SYSFS_WATCH_MIN_SECONDS = 0.1
# Worker exit codes (gpuwatchd.sources.nvml_worker; not imported here, that module imports pynvml).
EXIT_INIT_FAILED = 2
EXIT_REENUMERATE = 3
NOT_IN_A_GPU_CALL = (-1).to_bytes(4, "little", signed=True)  # progress word (see the worker's progress_fd)
# The worker's stderr line format (nvml_worker._log); anything else is unexpected output.
WORKER_LINE = re.compile(r"nvml_worker\[(\d+)\] (DEBUG|INFO|WARNING|ERROR): (.*)")
# Unexpected stderr output (a traceback) is gathered into one log record; it ends at EOF, at a regular line,
# or after this many real seconds without another line (a traceback is written in one go).
STDERR_BLOCK_IDLE_SECONDS = 0.2
# Lines kept per unexpected-output block: a traceback's tail says what happened; a worker printing without end
# must not grow the daemon.
STDERR_BLOCK_MAX_LINES = 60
# A worker's log line is a sentence or a traceback line; anything longer is noise, dropped with one warning.
MAX_STDERR_LINE_BYTES = 64 * 1024
STDERR_CHUNK_BYTES = 64 * 1024
# Distinct worker messages remembered to relay repeats at DEBUG (bounded: a worker could vary its text).
MAX_REMEMBERED_LINES = 256


@dataclass
class HangEpisode:
    """A GPU whose NVML calls block: from the first missed deadline until it answers again."""

    uuid: str | None
    started: float  # loop time the GPU was last heard from before the hang (scenario time is derived)
    kills: int = 1


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
        python: str = sys.executable,
    ) -> None:
        self.nvml = nvml
        self.processes = processes
        self.sysfs = sysfs
        self.clock = clock
        self.on_snapshot = on_snapshot
        self.on_stale = on_stale
        self.on_links = on_links
        self.env = dict(os.environ if env is None else env)
        self.python = python
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
        self._pci_seen: set[str] = set()
        self._known: dict[int, tuple[str, str | None]] = {}  # index -> (uuid, bus id) from the last snapshot
        # index -> (identity, loop time): GPUs a worker hung on; the next workers leave them alone (reported lost
        # with reason "timeout") so the other GPUs keep reporting, and retry them after restart_backoff_max.
        self._quarantine: dict[int, tuple[dict[str, Any], float]] = {}
        self._skipping: set[int] = set()  # quarantined GPUs the running worker leaves alone
        self._last_bus_ids: list[str] = []
        self._stopping = False
        self.hangs: dict[int, HangEpisode] = {}  # index -> the hang being reported (one WARNING per episode)
        self._failing: str | None = None  # the reason of the failure episode logged at WARNING (not hangs)
        self._failures = 0  # failed workers in that episode
        self._prev_lines: set[str] = set()  # messages the previous worker wrote (relayed again at DEBUG)
        self._cur_lines: set[str] = set()
        self._last_words: str | None = None  # the last unexpected stderr line of the current worker
        self._last_line_at = 0.0  # loop time of the last stdout line from the current worker

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
        self._signal(signal.SIGTERM)

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
            await self._terminate(self._proc)

    def _signal(self, sig: int) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)  # own session: the group id is the worker's pid

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.nvml.kill_grace)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()

    # -- main loop --------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Supervise until cancelled or stopped."""
        self._wake = asyncio.Event()
        watcher = asyncio.create_task(self._watch_sysfs(), name="nvml-sysfs-watch")
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
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            proc = self._proc
            if proc is not None:
                await asyncio.shield(self._terminate(proc))
            self._proc = None

    def _child_env(self) -> dict[str, str]:
        env = dict(self.env)
        lib = self.nvml.library_path
        if lib is not None:
            libdir = lib.parent if lib.name == LIBRARY_NAME else lib
            old = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = f"{libdir}:{old}" if old else str(libdir)
        # The worker imports this package; make that work from a source checkout too.
        pkg_parent = str(Path(__file__).resolve().parents[2])
        old_pp = env.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{pkg_parent}:{old_pp}" if old_pp else pkg_parent
        return env

    def _worker_options(self, progress_fd: int) -> str:
        opts: dict[str, Any] = {"interval": self._real(self.nvml.poll_interval), "top_n": self.processes.top_n,
                                "progress_fd": progress_fd}
        now = asyncio.get_running_loop().time()
        retry = self._real(self.nvml.restart_backoff_max)
        self._quarantine = {i: q for i, q in self._quarantine.items() if now - q[1] < retry}
        if self._quarantine:
            opts["skip"] = {str(i): q[0] for i, q in self._quarantine.items()}
        self._skipping = set(self._quarantine)
        lib = self.nvml.library_path
        if lib is not None:
            opts["library_path"] = str(lib if lib.name == LIBRARY_NAME else lib / LIBRARY_NAME)
        return json.dumps(opts)

    async def _run_worker(self) -> tuple[int, bool]:
        """One worker's life. Returns (on-time snapshots delivered, whether it ended as a failure)."""
        self._pci_seen = nvidia_devices(self.sysfs.root)
        progress = os.memfd_create("gpuwatchd-nvml-progress")
        try:
            os.pwrite(progress, NOT_IN_A_GPU_CALL, 0)
            return await self._run_worker_with(progress)
        finally:
            os.close(progress)

    async def _run_worker_with(self, progress: int) -> tuple[int, bool]:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", WORKER_MODULE, self._worker_options(progress),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._child_env(),
                start_new_session=True,
                limit=MAX_LINE_BYTES,
                pass_fds=(progress,),
            )
        except OSError as e:  # fork/exec failed (EAGAIN, ENOMEM, a bad interpreter path)
            self._stale(f"cannot start the NVML worker: {e.strerror or e}", "spawn_failed")
            return 0, True
        self._proc = proc
        self.spawned += 1
        self._prev_lines, self._cur_lines = self._cur_lines, set()
        self._last_words = None
        if self._stopping:  # stop() ran while we were spawning
            self._signal(signal.SIGTERM)
        assert proc.stdout is not None and proc.stderr is not None
        relay = asyncio.create_task(self._relay_stderr(proc.stderr, proc.pid), name="nvml-worker-stderr")
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
                    if "hello" in msg:
                        hello = True
                        deadline = now + self._real(self.nvml.poll_timeout)
                        continue
                    snap = self._receive(msg)
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
            await self._terminate(proc)
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
        said = f": {self._last_words}" if self._last_words else ""
        self._stale(f"NVML worker exited unexpectedly ({why}){said}"[:500], why)
        return delivered, True

    def _quarantine_stuck(self, progress: int) -> tuple[int | None, str]:
        """Which GPU the worker was calling when it missed its deadline; that GPU is left out of the next ones."""
        index = int.from_bytes(os.pread(progress, 4, 0), "little", signed=True)
        if index < 0:
            return None, ""
        uuid, bus = self._known.get(index, (None, None))
        self._quarantine[index] = ({"uuid": uuid, "pci_bus_id": bus}, asyncio.get_running_loop().time())
        return index, f" (stuck in a call on GPU {index}{' ' + uuid if uuid else ''})"

    def _stale(self, message: str, error: str, *, hung: int | None = None) -> None:
        self.last_error = error
        if hung is not None:
            self._log_hang(hung)
        else:
            self._failures += 1
            if error != self._failing:
                log.warning("NVML data stale: %s", message)
                self._failing = error
            else:
                log.debug("NVML data stale again (%d failed workers): %s", self._failures, message)
        if self.on_stale is not None:
            self.on_stale(message)

    def _log_hang(self, index: int) -> None:
        now = asyncio.get_running_loop().time()
        uuid = self._known.get(index, (None, None))[0]
        ep = self.hangs.get(index)
        name = f"GPU {index}{f' ({uuid})' if uuid else ''}"
        if ep is not None and ep.uuid == uuid:
            ep.kills += 1
            log.debug("NVML data stale: %s still blocks NVML calls (%d workers killed, %.1fs since it answered)",
                      name, ep.kills, (now - ep.started) * self.clock.speed)
            return
        self.hangs[index] = HangEpisode(uuid, self._last_line_at)
        log.warning(
            "NVML data stale: timeout: %s blocked an NVML call for more than %.1fs; the worker was killed, the other "
            "GPUs keep reporting and %s is shown lost (reason timeout), retried every %gs",
            name, (now - self._last_line_at) * self.clock.speed, f"GPU {index}", self.nvml.restart_backoff_max,
        )

    def _healthy(self, snap: Snapshot, delivered: int) -> None:
        """A good snapshot: end the hang episodes of GPUs that answer again, and a failure episode after a run."""
        if self.hangs:
            now = asyncio.get_running_loop().time()
            answering = {g.index: g.uuid for g in snap.gpus}
            listed = answering.keys() | {x.index for x in snap.lost}
            for index, ep in list(self.hangs.items()):
                if index in answering and (ep.uuid is None or answering[index] == ep.uuid):
                    del self.hangs[index]
                    log.info("GPU %d (%s) answers NVML calls again after %.1fs without an answer (%d worker(s) "
                             "killed)", index, answering[index], (now - ep.started) * self.clock.speed, ep.kills)
                elif index not in listed or (index in answering and answering[index] != ep.uuid):
                    del self.hangs[index]  # no longer enumerated there: nothing left to wait for
                    log.info("GPU %d%s that blocked NVML calls is no longer enumerated at that index", index,
                             f" ({ep.uuid})" if ep.uuid else "")
        if self._failing is not None and delivered >= HEALTHY_POLLS_TO_RESET_BACKOFF:
            log.info("NVML data fresh again after %d failed worker(s) (last failure: %s)", self._failures,
                     self._failing)
            self._failing = None
            self._failures = 0

    def _receive(self, msg: dict[str, Any]) -> Snapshot:
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
            self._last_bus_ids = [g.pci_bus_id for g in snap.gpus if g.pci_bus_id]
        return snap

    def _identify(self, lost: LostGpu) -> LostGpu:
        """A GPU lost at enumeration answers nothing, not even its UUID: name it from what the last worker saw."""
        if lost.uuid is not None:
            return lost
        known = self._known.get(lost.index)
        if known is None or (lost.pci_bus_id is not None and known[1] != lost.pci_bus_id):
            return lost
        return replace(lost, uuid=known[0], pci_bus_id=known[1])

    async def _relay_stderr(self, stream: asyncio.StreamReader, pid: int) -> None:
        """Relay the worker's stderr at the level each line names; unexpected output as one WARNING block.

        Read in chunks and split here, not with ``readline``: a line past the bound is dropped whole (one
        warning), where ``readline`` would raise and then hand over its tail as if it were a line.
        """
        block: list[str] = []
        pending = b""
        dropping = False  # inside a line too long to relay: skip up to its newline
        while True:
            try:
                if block:
                    chunk = await asyncio.wait_for(stream.read(STDERR_CHUNK_BYTES), STDERR_BLOCK_IDLE_SECONDS)
                else:
                    chunk = await stream.read(STDERR_CHUNK_BYTES)
            except asyncio.TimeoutError:
                self._flush_block(block, pid)
                continue
            if not chunk:
                if pending and not dropping:
                    self._stderr_line(pending, block, pid)
                self._flush_block(block, pid)
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                if dropping:
                    dropping = False
                    continue
                self._stderr_line(raw, block, pid)
            if len(pending) > MAX_STDERR_LINE_BYTES:
                if not dropping:
                    self._flush_block(block, pid)
                    self._relay(logging.WARNING, "a stderr line too long to relay (dropped)",
                                f"nvml_worker[{pid}]: %s")
                dropping, pending = True, b""

    def _stderr_line(self, raw: bytes, block: list[str], pid: int) -> None:
        text = raw.decode(errors="replace").rstrip()
        m = WORKER_LINE.fullmatch(text)
        if m is None:
            if text.strip():
                block.append(text)
                self._last_words = text.strip()[:300]
                del block[:-STDERR_BLOCK_MAX_LINES]
            return
        self._flush_block(block, pid)
        wpid, level, message = m.groups()
        self._relay(getattr(logging, level), message, f"nvml_worker[{wpid}]: %s")

    def _relay(self, level: int, message: str, fmt: str) -> None:
        if message in self._prev_lines or message in self._cur_lines:
            level = min(level, logging.DEBUG)
        if len(self._cur_lines) < MAX_REMEMBERED_LINES:
            self._cur_lines.add(message)
        log.log(level, fmt, message)

    def _flush_block(self, block: list[str], pid: int) -> None:
        if block:
            self._relay(logging.WARNING, "\n".join(block), f"unexpected output from the NVML worker [{pid}]:\n%s")
            block.clear()

    async def _watch_sysfs(self) -> None:
        """NVIDIA PCI functions appearing or vanishing (Thunderbolt detach, hot-add) call for a fresh worker."""
        while True:
            await asyncio.sleep(max(self._real(self.nvml.poll_interval), SYSFS_WATCH_MIN_SECONDS))
            current = nvidia_devices(self.sysfs.root)
            if current != self._pci_seen:
                added = sorted(current - self._pci_seen)
                removed = sorted(self._pci_seen - current)
                self._pci_seen = current
                self.request_restart(f"pci_devices_changed: added={added} removed={removed}")
            if self._skipping and self._proc is not None:
                now = asyncio.get_running_loop().time()
                retry = self._real(self.nvml.restart_backoff_max)
                due = [i for i in self._skipping if now - self._quarantine.get(i, ({}, 0.0))[1] >= retry]
                if due:
                    self._skipping = set()
                    # DEBUG: part of a hang episode, which is logged once (see _log_hang)
                    self._restart(f"retrying GPU(s) {sorted(due)} that hung", logging.DEBUG)
            if self.on_links is not None and self._last_bus_ids:
                self.on_links(read_links(self.sysfs.root, self._last_bus_ids))
