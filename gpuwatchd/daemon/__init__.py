"""The runtime: one asyncio loop that owns the store, the NVML supervisor, rules, dispatcher and HTTP server.

Embeddable: tests and ``gpuwatchd sim`` build a :class:`Daemon`, ``await start()``, ``await wait_closed()`` and
``await stop()``. ``gpuwatchd run`` does the same through :meth:`Daemon.serve`, which adds signal handling.
The daemon never calls NVML itself: :mod:`gpuwatchd.sources.nvml.supervisor` runs it in a child process.

This module is its lifecycle (start, the core tasks, stop, signals); each other concern is a module of this package:
``parts`` (what it holds), ``http`` (the web wiring), ``data_path`` (snapshots into the store), ``evaluation``
(the rules loop), ``health_view`` (the GPUs' health state), ``watchdog``, ``reload`` (SIGHUP) and ``status``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from gpuwatchd import __version__
from gpuwatchd.config.types import fields_set
from gpuwatchd.daemon.data_path import DataPath
from gpuwatchd.daemon.evaluation import Evaluation
from gpuwatchd.daemon.http import HttpWiring
from gpuwatchd.daemon.reload import Reload, ReloadResult
from gpuwatchd.daemon.watchdog import watchdog_loop
from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.model import ConfigReload, DockChange, LinkChange, NvmlCounters
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.remediation.service import Remediation
from gpuwatchd.rules import leak
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector
from gpuwatchd.runtime.gc_tuning import freeze_survivors, keep_frozen, paused
from gpuwatchd.runtime.startup import DaemonError, ListenError, StateDirError, resolve_state_dir
from gpuwatchd.sources.attribution.task import AttributionTask, socket_explicit
from gpuwatchd.sources.kmsg.task import KernelLogTask
from gpuwatchd.sources.nvml.protocol import WORKER_MODULE
from gpuwatchd.sources.nvml.supervisor import NvmlSupervisor
from gpuwatchd.sources.sysfs.thunderbolt import watch_docks
from gpuwatchd.sources.training.listener import SOCKET_NAME, TrainingListener, default_socket_path
from gpuwatchd.store.history_file import HistoryFile

__all__ = ["Daemon", "DaemonError", "ListenError", "ReloadResult", "StateDirError", "resolve_state_dir"]

log = logging.getLogger(__name__)

# Seconds (beyond the worker's kill grace) a stopping supervisor gets before its task is cancelled.
STOP_GRACE = 2.0
SUPERVISOR_TASK = "nvml supervisor"


class Daemon(DataPath, Evaluation, Reload, HttpWiring):
    """gpuwatchd's runtime. Not thread-safe: everything runs on the loop that called :meth:`start`."""

    async def start(self) -> None:
        """Bind HTTP, start the NVML supervisor, rules timer and dispatcher; READY=1 once serving."""
        if self._started:
            raise RuntimeError("daemon already started")
        self._started = True
        self._wakeup = asyncio.Event()
        self._closed = asyncio.Event()
        cfg = self.config
        self.state_dir = resolve_state_dir(cfg, self._env)
        # The config in force was loaded successfully at start: say when, so dashboards need no SIGHUP first.
        self.store.ingest(ConfigReload(True, self.clock.now()))
        self._engine = RulesEngine(cfg.rules, host=cfg.host)
        self.history = HistoryFile(self.state_dir, self.store, self.clock)
        with paused(freeze=self._freeze_gc):  # millions of lasting, acyclic points: no collection walks them
            self.history.load()
            if self.history.restored:
                leak.prime(self.store, cfg.rules.leak.host_rss)  # the first evaluation reads only what came since
        self.registry.register(self.history.collector())
        self.remediation = Remediation(cfg.remediation, self.store, self.clock, self.state_dir, host=cfg.host)
        self.registry.register(self.remediation.collector())
        self._dispatcher = Dispatcher(cfg.notify, state_dir=self.state_dir, clock=self.clock, host=cfg.host)
        self.probes = ProbeService(cfg, self.store, self.clock, self.state_dir, sim=self._probe_sim)
        self.registry.register(StoreCollector(self.store, now=self.clock.now))
        if cfg.exporter.compat == "dcgm":
            from gpuwatchd.exporter.dcgm_compat import DcgmCompatCollector

            self.registry.register(DcgmCompatCollector(self.store, cfg.host))
        self._alerts_collector = AlertsCollector(self._engine)
        self.registry.register(self._alerts_collector)
        self.registry.register(self._dispatcher.collector())
        try:
            await self._dispatcher.start()
            await self._start_http()
        except BaseException:
            await self._teardown()
            raise
        self._supervisor = NvmlSupervisor(
            cfg.nvml,
            cfg.processes,
            cfg.sysfs,
            clock=self.clock,
            on_snapshot=self._on_snapshot,
            on_stale=self._on_stale,
            env=self._worker_env,
            on_links=lambda links: self.store.ingest(LinkChange(tuple(links))),
            on_counters=lambda restarts, failures: self.store.ingest(NvmlCounters(restarts, failures)),
            on_late=self._on_late,
            worker_module=self._worker_module,
        )
        self._spawn(self._supervisor.run(), SUPERVISOR_TASK)
        self._spawn(watch_docks(lambda: self.config, self.clock, lambda docks: self.store.ingest(DockChange(docks)),
                                beat=self._supervisor.beat), "thunderbolt watch")
        if cfg.kernel_log.enabled:
            self.kernel_log = KernelLogTask(cfg.kernel_log, self.store, clock=self.clock, state_dir=self.state_dir,
                                            sysfs_root=cfg.sysfs.root, on_event=self._wakeup.set,
                                            backlog_horizon=cfg.rules.xid.resolve_after)
            self._spawn(self.kernel_log.run(), "kernel log")
        if cfg.attribution.enabled:
            self.attribution = AttributionTask(
                cfg.attribution,
                socket_explicit=socket_explicit(fields_set(cfg.attribution.kubernetes)),
                on_update=self._attribute,
                on_status=self.store.ingest,
                # The stand-in's pids are fictitious: read cgroups only from a fake /proc the config names.
                read_proc=self._worker_module == WORKER_MODULE or cfg.attribution.proc_root != Path("/proc"),
            )
            self._spawn(self.attribution.run(), "attribution")
        if cfg.training.enabled:  # PyTorch's allocator from training processes (docs/training.md)
            # `gpuwatchd sim` keeps its socket in its own state directory, clear of a real daemon's on the same host.
            sim = self._worker_module != WORKER_MODULE
            path = cfg.training.socket or (self.state_dir / SOCKET_NAME if sim else default_socket_path(self._env))
            self.training = TrainingListener(cfg.training, self.store, self.clock, path)
            self._spawn(self.training.run(), "training socket")
        self._spawn(self._evaluate_loop(), "rules evaluation")
        self._spawn(self.history.run(), "rule history")
        self._spawn(self.probes.run(), "probe scheduler")
        self._spawn(self.remediation.run(), "remediation")
        if self.sd.watchdog_interval is not None:
            self._spawn(watchdog_loop(self.sd, self.sd.watchdog_interval), "systemd watchdog")
        if self._freeze_gc:
            freeze_survivors()  # imports, config and start-up objects live as long as the process
            self._spawn(keep_frozen(), "gc freezer")
        log.info("gpuwatchd %s serving on %s (state in %s)", __version__, self.url, self.state_dir)
        self.sd.ready(self._status_line())

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        # Every core task runs until stop; one that ends early leaves the daemon blind, so stop and let systemd
        # restart us rather than serve stale data forever.
        log.error("%s ended unexpectedly: %r; stopping", task.get_name(), exc or "returned", exc_info=exc)
        self.failure = exc or RuntimeError(f"{task.get_name()} returned")
        self.request_stop()

    def request_stop(self) -> None:
        """Ask :meth:`wait_closed` to return (signal handlers, tests)."""
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        """Until a stop is requested (SIGTERM/SIGINT, :meth:`request_stop`, a failed core task)."""
        if self._closed is None:
            raise RuntimeError("daemon not started")
        await self._closed.wait()

    async def stop(self) -> None:
        """Graceful stop: STOPPING=1, worker down, dispatcher flushed to its outbox, HTTP closed."""
        if self._stopping:
            return
        self._stopping = True
        self.request_stop()
        self.sd.stopping()
        log.info("stopping")
        if self.history is not None:
            await self.history.save()  # the freshest history for the next start
        await self._teardown()

    async def _teardown(self) -> None:
        supervisor_task = next((t for t in self._tasks if t.get_name() == SUPERVISOR_TASK), None)
        for task in self._tasks:
            if task is not supervisor_task:
                task.cancel()
        if self._supervisor is not None:
            await self._supervisor.stop()
        if supervisor_task is not None:
            # stop() ends run() between polls; if a worker was being replaced at that moment, run() may still be
            # reading from the new one, so cancel after a grace (run() kills its worker on the way out).
            _, pending = await asyncio.wait({supervisor_task}, timeout=self.config.nvml.kill_grace + STOP_GRACE)
            for task in pending:
                task.cancel()
        # Failures were logged by _task_done; here we only wait for the tasks to be gone.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._dispatcher is not None:
            await self._dispatcher.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def serve(self) -> int:
        """``gpuwatchd run``: start, handle SIGHUP/SIGTERM/SIGINT, stop; returns the process exit code."""
        loop = asyncio.get_running_loop()
        await self.start()
        reloads: set[asyncio.Task[ReloadResult]] = set()  # the loop keeps only weak references to tasks

        def on_sighup() -> None:
            task = asyncio.ensure_future(self.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_sighup)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self.wait_closed()
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()
        return 0 if self.failure is None else DaemonError.exit_code
