"""What a :class:`~gpuwatchd.daemon.Daemon` holds: its parts, built (not started) from the config, and the
accessors of those that exist only once it started. The daemon's other modules each add one concern to it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuwatchd.config.loader import Config, parse_listen
from gpuwatchd.model import Alert
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.probes.faults import ProbeSim
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.remediation.service import Remediation
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector
from gpuwatchd.runtime.clock import Clock, RealClock
from gpuwatchd.runtime.nvml_outage import NvmlOutageLog
from gpuwatchd.runtime.sdnotify import SdNotifier
from gpuwatchd.sources.attribution.task import AttributionTask
from gpuwatchd.sources.kmsg.task import KernelLogTask
from gpuwatchd.sources.nvml.protocol import WORKER_MODULE
from gpuwatchd.sources.nvml.supervisor import NvmlSupervisor
from gpuwatchd.sources.training.listener import TrainingListener
from gpuwatchd.store import Store
from gpuwatchd.store.history_file import HistoryFile


def _display_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class DaemonParts:
    """The daemon's state. Not thread-safe: everything runs on the loop that called ``start``."""

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
        probe_sim: ProbeSim | None = None,
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
        self.training: TrainingListener | None = None  # the training socket (sources/training)
        self.history: HistoryFile | None = None  # rule history kept across restarts (store/history_file.py)
        self.status_extra: Callable[[], dict[str, Any]] | None = None
        self._probe_sim = probe_sim  # gpuwatchd sim only: probes on the CPU device, faults from the scenario
        self.probes: ProbeService | None = None
        self.remediation: Remediation | None = None  # acting on health: Slurm drain, escalation (remediation/)
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
