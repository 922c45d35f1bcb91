"""The runtime: one asyncio loop that owns the store, the NVML supervisor, rules, dispatcher and HTTP server.

Embeddable: tests and ``gpuwatchd sim`` build a :class:`Daemon`, ``await start()``, ``await wait_closed()`` and
``await stop()``. ``gpuwatchd run`` does the same through :meth:`Daemon.serve`, which adds signal handling.
The daemon never calls NVML itself: :mod:`gpuwatchd.sources.nvml.supervisor` runs it in a child process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuwatchd import __version__
from gpuwatchd.config.loader import Config, ConfigError, load_config, parse_listen
from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.dcgm_compat import DcgmCompatCollector
from gpuwatchd.gpu.health_view import update_health
from gpuwatchd.model import (
    Alert,
    ConfigReload,
    DockChange,
    LinkChange,
    NvmlCounters,
    NvmlStale,
    Snapshot,
    SourceStatus,
)
from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.probes.api import probe_routes
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.probes.sim import SimProbes
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector
from gpuwatchd.runtime.clock import Clock, RealClock
from gpuwatchd.runtime.gc_tuning import freeze_survivors, keep_frozen
from gpuwatchd.runtime.nvml_outage import NvmlOutageLog
from gpuwatchd.runtime.sdnotify import SdNotifier
from gpuwatchd.runtime.startup import DaemonError, ListenError, StateDirError, listen_error, resolve_state_dir
from gpuwatchd.sources.attribution.task import AttributionTask, socket_explicit
from gpuwatchd.sources.kmsg.task import KernelLogTask
from gpuwatchd.sources.nvml.protocol import WORKER_MODULE
from gpuwatchd.sources.nvml.supervisor import NvmlSupervisor
from gpuwatchd.sources.sysfs.thunderbolt import watch_docks
from gpuwatchd.store import Store
from gpuwatchd.store.history_file import HistoryFile
from gpuwatchd.web.auth import BasicAuth
from gpuwatchd.web.detail import add_details
from gpuwatchd.web.http import make_app
from gpuwatchd.web.server import start_server
from gpuwatchd.web.status import status_from_store
from gpuwatchd.web.webconfig import WebConfigError, load_web_config

__all__ = ["Daemon", "DaemonError", "ListenError", "ReloadResult", "StateDirError", "resolve_state_dir"]

log = logging.getLogger(__name__)

# Rules also run on this timer (clock seconds) when no snapshot arrives, so a hung worker still raises alerts.
MIN_EVAL_INTERVAL = 1.0
# Seconds (beyond the worker's kill grace) a stopping supervisor gets before its task is cancelled.
STOP_GRACE = 2.0
SUPERVISOR_TASK = "nvml supervisor"


@dataclass(frozen=True, slots=True)
class ReloadResult:
    ok: bool
    problems: Sequence[str] = ()
    restart_needed: Sequence[str] = ()  # settings that changed but only apply after a restart


def _display_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Daemon:
    """gpuwatchd's runtime. Not thread-safe: everything runs on the loop that called :meth:`start`."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: Path | None = None,
        clock: Clock | None = None,
        worker_env: Mapping[str, str] | None = None,
        listen: str | None = None,
        notifier: SdNotifier | None = None,
        env: Mapping[str, str] | None = None,
        worker_module: str = WORKER_MODULE,
        probe_sim: SimProbes | None = None,
        web_config_file: Path | None = None,
        freeze_gc: bool = False,
    ) -> None:
        self.config = config
        # runtime/gc_tuning.py: only where the daemon owns its process (run, sim), never inside a test's interpreter
        self._freeze_gc = freeze_gc
        self._worker_module = worker_module  # gpuwatchd.sim.worker under the simulator
        self.config_path = config_path
        self.clock: Clock = clock or RealClock()
        self._env = os.environ if env is None else env
        self._worker_env = worker_env
        self._listen = listen or config.listen
        parse_listen(self._listen)  # a bad --listen fails here, before anything starts
        # TLS and basic auth (web/webconfig.py); --web.config.file overrides the config key, like --listen.
        self._web_config_file = web_config_file or config.web_config_file
        self._tls = False
        self.sd = notifier or SdNotifier(self._env)
        self.store = Store(retention_seconds=config.history.retention, step_seconds=config.history.step)
        self.registry = CollectorRegistry(auto_describe=False)
        self.alerts: list[Alert] = []
        self.state_dir: Path | None = None
        self.host = ""
        self.port = 0
        self.failure: BaseException | None = None
        self._engine: RulesEngine | None = None
        self._alerts_collector: AlertsCollector | None = None
        self._dispatcher: Dispatcher | None = None
        self._supervisor: NvmlSupervisor | None = None
        self.kernel_log: KernelLogTask | None = None
        self.attribution: AttributionTask | None = None  # who holds each GPU process (sources/attribution)
        self.history: HistoryFile | None = None  # rule history kept across restarts (store/history_file.py)
        self.status_extra: Callable[[], dict[str, Any]] | None = None
        self._probe_sim = probe_sim  # gpuwatchd sim only: probes on the CPU device, faults from the scenario
        self.probes: ProbeService | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wakeup: asyncio.Event | None = None
        self._closed: asyncio.Event | None = None
        self._started = False
        self._stopping = False
        self._outage = NvmlOutageLog()
        self._last_status = ""
        self._generation = 0
        self._reload_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the bound HTTP server (loopback when listening on all interfaces)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)  # noqa: S104
        return f"{'https' if self._tls else 'http'}://{_display_host(host)}:{self.port}"

    @property
    def supervisor(self) -> NvmlSupervisor:
        if self._supervisor is None:
            raise RuntimeError("daemon not started")
        return self._supervisor

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("daemon not started")
        return self._dispatcher

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
        self.history.load()
        self.registry.register(self.history.collector())
        self._dispatcher = Dispatcher(cfg.notify, state_dir=self.state_dir, clock=self.clock, host=cfg.host)
        self.probes = ProbeService(cfg, self.store, self.clock, self.state_dir, sim=self._probe_sim)
        self.registry.register(StoreCollector(self.store, now=self.clock.now))
        if cfg.exporter.compat == "dcgm":
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
        self._spawn(watch_docks(lambda: self.config, self.clock, lambda docks: self.store.ingest(DockChange(docks))),
                    "thunderbolt watch")
        if cfg.kernel_log.enabled:
            self.kernel_log = KernelLogTask(cfg.kernel_log, self.store, clock=self.clock, state_dir=self.state_dir,
                                            sysfs_root=cfg.sysfs.root, on_event=self._wakeup.set,
                                            backlog_horizon=cfg.rules.xid.resolve_after)
            self._spawn(self.kernel_log.run(), "kernel log")
        if cfg.attribution.enabled:
            self.attribution = AttributionTask(
                cfg.attribution,
                socket_explicit=socket_explicit(cfg.attribution.kubernetes.model_fields_set),
                on_update=self._attribute,
                on_status=self.store.ingest,
                # The stand-in's pids are fictitious: read cgroups only from a fake /proc the config names.
                read_proc=self._worker_module == WORKER_MODULE or cfg.attribution.proc_root != Path("/proc"),
            )
            self._spawn(self.attribution.run(), "attribution")
        self._spawn(self._evaluate_loop(), "rules evaluation")
        self._spawn(self.history.run(), "rule history")
        self._spawn(self.probes.run(), "probe scheduler")
        if self.sd.watchdog_interval is not None:
            self._spawn(self._watchdog_loop(self.sd.watchdog_interval), "systemd watchdog")
        if self._freeze_gc:
            freeze_survivors()  # imports, config and start-up objects live as long as the process
            self._spawn(keep_frozen(), "gc freezer")
        log.info("gpuwatchd %s serving on %s (state in %s)", __version__, self.url, self.state_dir)
        self.sd.ready(self._status_line())

    async def _start_http(self) -> None:
        host, port = parse_listen(self._listen)
        app = make_app(
            registry=self.registry,
            status=self.status,
            ready=self.ready,
            extra_routes=[*build_routes(self.dispatcher, lambda: self.alerts), *self._probe_routes()],
            cache_key=self._metrics_cache_key,
        )
        tls, middlewares = None, []
        if self._web_config_file is not None:
            try:
                web_config = load_web_config(self._web_config_file)
                tls = web_config.ssl_context()
            except WebConfigError as e:
                raise DaemonError(f"web config {self._web_config_file}: {e}") from None
            if web_config.basic_auth_users:
                auth = BasicAuth(web_config.basic_auth_users)
                middlewares.append(auth.middleware())
                self.registry.register(auth.collector())

                async def close_auth(_: web.Application) -> None:
                    auth.close()

                app.on_cleanup.append(close_auth)
        self._tls = tls is not None
        # Connection cap and timeouts, dual-stack [::], malformed requests as rate-limited debug lines.
        try:
            server = await start_server(
                app, host, port, self.config.http, self.registry, tls=tls, middlewares=middlewares
            )
        except OSError as e:
            raise listen_error(e, host, port) from None
        self._runner = server.runner
        self.host = host
        # With port 0 (tests) the kernel picks the port; report the one actually bound.
        self.port = server.port
        if not self._tls and not middlewares and not _loopback(host):
            log.warning(
                "listening on %s:%d without TLS or basic auth: anyone who reaches this port reads the GPUs, the "
                "processes on them (names, pids, users) and the alerts (/metrics, /api/v1/status, /api/v1/alerts); "
                "set web_config_file, or listen on 127.0.0.1 when only local scrapers read it (docs/security.md)",
                host, self.port,
            )

    def _probe_routes(self) -> list[web.RouteDef]:
        return probe_routes(self.probes, lambda: self.config.notify.api) if self.probes is not None else []

    def _metrics_cache_key(self) -> tuple[int, int, int]:
        # The store's version covers GPU data, our generation counter alerts and reloads; the notification counters
        # have no version, so the whole-second bucket bounds how stale a reused /metrics body can be to 1 s.
        return (self.store.version, self._generation, int(time.monotonic()))

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

    # -- data path ---------------------------------------------------------------------------------------------

    def _on_snapshot(self, snap: Snapshot) -> None:
        if self.kernel_log is not None:
            snap = self.kernel_log.filter_snapshot(snap)  # an Xid the kernel log already counted is not recounted
        self.store.apply(snap)
        self._attribute()
        if self.history is not None:
            self.history.on_snapshot(snap)
        if self.kernel_log is not None:
            self.kernel_log.after_snapshot(snap)
        # node_exporter style self-metrics: a driver outage is a failed collection, not an empty one.
        self.store.ingest(
            SourceStatus(
                name="nvml",
                success=snap.nvml_ok,
                duration_seconds=snap.poll_duration_seconds or 0.0,
                timestamp=snap.timestamp,
                error=snap.nvml_error,
            )
        )
        self._outage.observe(snap, self.config.nvml)
        if self._wakeup is not None:
            self._wakeup.set()

    def _attribute(self) -> None:
        """Owners of the latest snapshot's processes into the store (after a snapshot and a kubelet refresh)."""
        snap = self.store.latest
        if self.attribution is not None and snap is not None:
            self.store.ingest(self.attribution.resolve(snap))

    def _on_late(self, silent_seconds: float) -> None:
        # A poll is late: the values shown are being held, and /metrics says so (gpuwatchd_nvml_stale 1) at once.
        self.store.ingest(NvmlStale())

    def _on_stale(self, reason: str) -> None:
        self.store.ingest(NvmlStale())
        prev = self.store.sources.get("nvml")
        self.store.ingest(
            SourceStatus(
                name="nvml",
                success=False,
                duration_seconds=prev.duration_seconds if prev else 0.0,
                timestamp=self.clock.now(),
                error=reason,
            )
        )
        # DEBUG: the supervisor logs each hang or failure episode once, not once per kill cycle.
        log.debug("NVML worker missed its deadline (%s); serving the last values marked stale", reason)
        if self._wakeup is not None:
            self._wakeup.set()

    async def _evaluate_loop(self) -> None:
        assert self._wakeup is not None
        while True:
            interval = max(MIN_EVAL_INTERVAL, self.config.nvml.poll_interval) / self.clock.speed
            # asyncio.wait, not wait_for: on Python < 3.12 wait_for swallows a cancel that races with the event
            # being set (cpython#86296), and snapshots set it ten times a second in tests.
            waiter = asyncio.ensure_future(self._wakeup.wait())
            try:
                await asyncio.wait({waiter}, timeout=interval)
            finally:
                waiter.cancel()
            self._wakeup.clear()
            self.evaluate()

    def evaluate(self) -> list[Alert]:
        """Run the rules on the store now and hand the result to the dispatcher."""
        if self._engine is None or self._dispatcher is None:
            raise RuntimeError("daemon not started")
        now = self.clock.now()
        self.alerts = list(self._engine.evaluate(self.store, now))
        update_health(self.store, self.alerts, now)
        self._generation += 1
        self._dispatcher.update(self.alerts)
        status = self._status_line()
        if status != self._last_status:
            self._last_status = status
            self.sd.status(status)
        return self.alerts

    async def _watchdog_loop(self, interval: float) -> None:
        # Sent from the event loop itself: if the loop wedges, the pings stop and systemd restarts us. A hung NVML
        # call cannot wedge it (it is in the worker process), so a dead GPU does not cause restart loops.
        while True:
            self.sd.watchdog()
            await asyncio.sleep(interval)

    # -- views ----------------------------------------------------------------------------------------------------

    def ready(self) -> bool:
        """/readyz: serving and the first NVML result (data or a definite error) is in."""
        return self._started and not self._stopping and self.store.latest is not None

    def status(self) -> dict[str, Any]:
        """/api/v1/status: the store's view plus the runtime's own facts."""
        out = dict(status_from_store(self.store))
        sup = self._supervisor
        out["daemon"] = {
            "version": __version__,
            "host": self.config.host,
            "listen": self._listen,
            "config_path": str(self.config_path) if self.config_path else None,
            "state_dir": str(self.state_dir) if self.state_dir else None,
            "nvml_worker_restarts": sup.restarts if sup else 0,
            "nvml_last_error": str(sup.last_error) if sup and sup.last_error else None,
            "config_reload_success": self.store.config_reload_success,
            "alerts_firing": sum(a.state == "firing" for a in self.alerts),
        }
        if self.probes is not None:
            out["probes"] = self.probes.status()
        if self.status_extra is not None:
            out.update(self.status_extra())  # gpuwatchd sim: the scenario clock
        return add_details(out, self.store, self.alerts, self._dispatcher, self.clock.now())

    def _status_line(self) -> str:
        snap = self.store.latest
        if snap is None:
            nvml = "waiting for NVML"
        elif snap.nvml_ok:
            nvml = f"{len(snap.gpus)} GPU(s)" + (" (stale)" if self.store.stale else "")
        else:
            nvml = f"no GPU data: {snap.nvml_error}"
        firing = sum(a.state == "firing" for a in self.alerts)
        return f"serving on {self.url}; {nvml}; {firing} alert(s) firing"

    # -- reload ---------------------------------------------------------------------------------------------------

    async def reload(self) -> ReloadResult:
        """SIGHUP: re-read the config; a bad file keeps the running config and sets the reload metric to 0.

        The file is read and parsed in a worker thread (bounded in size and alias expansion by the loader), so a
        hostile or slow file never stalls scrapes or polls; reloads run one at a time.
        """
        async with self._reload_lock:
            self.sd.reloading()
            loop = asyncio.get_running_loop()
            try:
                new = await loop.run_in_executor(
                    None, functools.partial(load_config, self.config_path, required=self.config_path is not None)
                )
            except ConfigError as e:
                return self._reload_failed(e.problems, "; ".join(str(e).splitlines()))
            except Exception as e:  # whatever the file does, the running config stays and the failure is said
                return self._reload_failed([f"{type(e).__name__}: {e}"], f"{self.config_path}: {type(e).__name__}")
            restart_needed = self._apply(new)
            self.store.ingest(ConfigReload(True, self.clock.now()))
            self._generation += 1
            for key in restart_needed:
                log.warning("config reload: %s changed; it takes effect after a restart", key)
            log.info("config reloaded from %s", self.config_path or "defaults")
            self.sd.ready(self._status_line())
            if self._wakeup is not None:
                self._wakeup.set()
            return ReloadResult(ok=True, restart_needed=restart_needed)

    def _reload_failed(self, problems: list[str], line: str) -> ReloadResult:
        self.store.ingest(ConfigReload(False))
        self._generation += 1
        log.error("config reload failed; keeping the running config: %s", line)
        self.sd.ready(self._status_line())
        return ReloadResult(ok=False, problems=problems)

    def _apply(self, new: Config) -> list[str]:
        old = self.config
        self.config = new
        if self._supervisor is not None and (
            new.nvml != old.nvml or new.processes != old.processes or new.sysfs != old.sysfs
        ):
            self._supervisor.reconfigure(new.nvml, new.processes, new.sysfs)
        if self.probes is not None:
            self.probes.reconfigure(new)
        if self._dispatcher is not None and new.notify != old.notify:
            self._dispatcher.reconfigure(new.notify)
        if self._engine is not None:
            if new.host != old.host:
                # host is a label on every alert: a fresh engine, so old-host alerts are not carried over.
                self._replace_engine(RulesEngine(new.rules, host=new.host))
            elif new.rules != old.rules:
                self._engine.reconfigure(new.rules)
        restart = [k for k in ("state_dir", "history", "kernel_log", "attribution")
                   if getattr(new, k) != getattr(old, k)]
        if new.listen != old.listen and self._listen == old.listen:
            restart.append("listen")
        if new.web_config_file != old.web_config_file and self._web_config_file == old.web_config_file:
            restart.append("web_config_file")
        return restart

    def _replace_engine(self, engine: RulesEngine) -> None:
        if self._alerts_collector is not None:
            self.registry.unregister(self._alerts_collector)
        self._engine = engine
        self._alerts_collector = AlertsCollector(engine)
        self.registry.register(self._alerts_collector)


def _loopback(host: str) -> bool:
    """Whether a listen host only accepts local connections (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
