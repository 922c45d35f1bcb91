"""The daemon's views of itself: ``/readyz``, ``/api/v1/status`` (the store's view plus the runtime's own facts) and
the one-line status handed to systemd."""

from __future__ import annotations

from typing import Any

from gpuwatchd import __version__
from gpuwatchd.daemon.parts import DaemonParts


class StatusViews(DaemonParts):
    def ready(self) -> bool:
        """/readyz: serving and the first NVML result (data or a definite error) is in."""
        return self._started and not self._stopping and self.store.latest is not None

    def status(self) -> dict[str, Any]:
        """/api/v1/status: the store's view plus the runtime's own facts."""
        # Imported at the first request (``gpuwatchd status``, the status page), not on the way to the first /metrics.
        from gpuwatchd.web.detail import add_details
        from gpuwatchd.web.status import status_from_store

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
