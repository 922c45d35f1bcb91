"""Serving the app: listening sockets (``[::]`` is dual-stack), the connection guard, timeouts and request logging.

``listen: "[::]:9945"`` answers on IPv4 and IPv6 like node_exporter: one IPv6 socket with ``IPV6_V6ONLY`` off
(asyncio's ``create_server`` turns it on, which left IPv4 clients out). Any other host is bound on each address it
resolves to. The limits are in ``connections.py``, refused body framings (compressed bodies, odd transfer codings) in
``body_framing.py``, malformed-request logging in ``request_log.py``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from gpuwatchd.web.body_framing import BodyFraming
from gpuwatchd.web.config import HttpConfig
from gpuwatchd.web.connections import ACCEPT_BURST, ConnectionGuard
from gpuwatchd.web.request_log import RequestLogger

# Pending connections the kernel queues for us; asyncio also accepts up to this many per wake-up, which the
# connection guard's descriptor budget counts on.
BACKLOG = ACCEPT_BURST
# aiohttp's own keep-alive close, behind the guard's idle timeout as a backstop.
KEEPALIVE_BACKSTOP_SECONDS = 5.0
# How long a request's body may linger unread after its answer (aiohttp reads and drops it), then the connection
# is closed.
LINGER_SECONDS = 5.0
# One line per this many seconds for the event loop's per-connection errors (below), however many there are.
CONNECTION_ERROR_LOG_SECONDS = 60.0

log = logging.getLogger(__name__)


class ConnectionErrorLog:
    """The event loop's exception handler, for errors of single connections: one line a minute with a count.

    asyncio reports a failed ``accept`` (EMFILE), a reset peer or an SSL failure on one socket to the loop's handler,
    which logs a traceback each time: under a flood that is thousands of tracebacks a second (50 MB of log in 40 s)
    for what is the client's doing. Those (any ``OSError``: ``ssl.SSLError`` and ``ConnectionError`` are ones) are
    counted and summarized; anything else still goes to the default handler, traceback and all.
    """

    def __init__(self, previous: Any = None) -> None:
        self._previous = previous
        self.count = 0
        self._since_logged = 0
        self._logged = 0.0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not isinstance(exc, OSError):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.count += 1
        self._since_logged += 1
        now = time.monotonic()
        if now - self._logged >= CONNECTION_ERROR_LOG_SECONDS:
            log.warning("http: %d connection error(s) in the last minute, latest: %s: %s",
                        self._since_logged, context.get("message", "error"), exc.strerror or exc)
            self._logged, self._since_logged = now, 0


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, non-blocking stream sockets for ``host:port`` (OSError as the bind failed)."""
    if host in ("::", ""):
        try:
            return [_bind(socket.AF_INET6, ("::", port), dual_stack=True)]
        except OSError as e:
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            # A host without IPv6: all IPv4 interfaces is what the user wants from "all interfaces".
            return [_bind(socket.AF_INET, ("0.0.0.0", port))]  # noqa: S104 - listening on all interfaces is asked
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    out: list[socket.socket] = []
    try:
        for family, _, _, _, addr in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
            out.append(_bind(family, addr))
    except OSError:
        for s in out:
            s.close()
        raise
    return out


def _bind(family: int, addr: tuple[object, ...], *, dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(addr)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class GuardedSite(web.SockSite):
    """aiohttp's ``SockSite`` whose connections go through a :class:`ConnectionGuard`."""

    __slots__ = ("_guard", "_tls")

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(runner, sock, backlog=BACKLOG)
        self._guard = guard
        self._tls = tls  # the web config's TLS (web/webconfig.py); None is plain HTTP

    async def start(self) -> None:
        # SockSite.start with the guard around the protocol factory; BaseSite.start registers us with the runner,
        # so runner.cleanup() stops this site like any other.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server, self._tls), sock=self._sock, backlog=self._backlog
        )


@dataclass
class HttpServer:
    runner: web.AppRunner
    guard: ConnectionGuard
    request_log: RequestLogger
    port: int


async def start_server(
    app: web.Application,
    host: str,
    port: int,
    config: HttpConfig,
    registry: CollectorRegistry | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    middlewares: Sequence[Middleware] = (),
) -> HttpServer:
    """Serve ``app`` on ``host:port`` with the limits of ``config``; their metrics go to ``registry``.

    ``tls`` serves HTTPS only; ``middlewares`` run inside the connection guard (basic auth: ``web/auth.py``).

    Raises OSError when a socket cannot be bound (nothing is left running then).
    """
    guard = ConnectionGuard(config)
    framing = BodyFraming()
    request_log = RequestLogger()
    loop = asyncio.get_running_loop()
    if not isinstance(loop.get_exception_handler(), ConnectionErrorLog):
        loop.set_exception_handler(ConnectionErrorLog(loop.get_exception_handler()))
    app.middlewares.append(guard.middleware())
    # Before auth: a compressed body is refused without a bcrypt check, and never inflated.
    app.middlewares.append(framing.middleware())
    app.middlewares.extend(middlewares)

    async def stop_guard(_: web.Application) -> None:
        guard.close()

    app.on_cleanup.append(stop_guard)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        logger=request_log,
        keepalive_timeout=config.idle_timeout + KEEPALIVE_BACKSTOP_SECONDS,
        lingering_time=LINGER_SECONDS,
    )
    await runner.setup()
    try:
        socks = listen_sockets(host, port)
        for sock in socks:
            await GuardedSite(runner, sock, guard, tls).start()
    except BaseException:
        await runner.cleanup()
        raise
    if registry is not None:
        registry.register(guard.collector())
        registry.register(request_log.collector())
        registry.register(framing.collector())
    bound = socks[0].getsockname()[1] if socks else port
    return HttpServer(runner, guard, request_log, int(bound))
