"""The daemon's HTTP wiring: the aiohttp application with the routes of the notifier API and the probe service, TLS
and basic auth from the web config file, the listening sockets (``web/``)."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from gpuwatchd.config.loader import parse_listen
from gpuwatchd.daemon.status import StatusViews
from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.cross_site import LISTEN_HOST
from gpuwatchd.probes.api import probe_routes
from gpuwatchd.remediation.api import health_routes
from gpuwatchd.runtime.startup import DaemonError, listen_error
from gpuwatchd.web.http import make_app
from gpuwatchd.web.server import start_server
from gpuwatchd.web.status_body import time_bucket

log = logging.getLogger("gpuwatchd.daemon")


class HttpWiring(StatusViews):
    async def _start_http(self) -> None:
        host, port = parse_listen(self._listen)
        app = make_app(
            registry=self.registry,
            status=self.status,
            ready=self.ready,
            extra_routes=[*build_routes(self.dispatcher, lambda: self.alerts), *self._probe_routes(),
                          *self._health_routes()],
            cache_key=self._metrics_cache_key,
            status_key=self._status_key,
        )
        app[LISTEN_HOST] = host  # one of the daemon's own names for the cross-site write checks
        tls, middlewares = None, []
        if self._web_config_file is not None:
            # Only with a web config: its models and the basic-auth stack are not loaded otherwise.
            from gpuwatchd.web.auth import BasicAuth
            from gpuwatchd.web.webconfig import WebConfigError, load_web_config

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

    def _health_routes(self) -> list[web.RouteDef]:
        if self.remediation is None:
            return []
        return health_routes(self.remediation, lambda: self.config.notify.api)

    def _metrics_cache_key(self) -> tuple[int, int, int]:
        # The store's version covers GPU data, our generation counter alerts and reloads; the notification counters
        # have no version, so the whole-second bucket bounds how stale a reused /metrics body can be to 1 s.
        return (self.store.version, self._generation, int(time.monotonic()))


    def _status_key(self) -> tuple[int, int, int]:
        # As /metrics' key, with a shorter time bucket: the status also shows the receivers' recent deliveries and
        # the scenario clock, which have no version (web/status_body.py).
        return (self.store.version, self._generation, time_bucket())


def _loopback(host: str) -> bool:
    """Whether a listen host only accepts local connections (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
