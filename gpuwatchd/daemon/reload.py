"""SIGHUP: re-read the config in a worker thread and hand the new one to every part that can take it live; what
only a restart applies is named."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.config.loader import Config, ConfigError, load_config
from gpuwatchd.daemon.status import StatusViews
from gpuwatchd.model import ConfigReload
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.metrics import AlertsCollector

log = logging.getLogger("gpuwatchd.daemon")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    ok: bool
    problems: Sequence[str] = ()
    restart_needed: Sequence[str] = ()  # settings that changed but only apply after a restart


class Reload(StatusViews):
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
        restart = [k for k in ("state_dir", "history", "kernel_log", "attribution", "remediation", "training")
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
