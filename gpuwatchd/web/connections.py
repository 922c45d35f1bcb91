"""Connection limits of the HTTP server: a cap well under the open-file limit, idle and header timeouts.

Without them, idle connections pile up until the process runs out of file descriptors, and then whatever opens a
file next fails: the NVML supervisor's pipes to a new worker, SQLite, a probe. So every accepted connection passes
through :class:`ConnectionGuard`:

- at most ``limit`` connections are open. At the cap, the connection idle longest (no request under way: a kept
  alive one, one that never sent anything, a slowloris) is closed to make room, so an idle flood cannot lock out a
  scraper; only when every connection is busy with a request is the new one refused (closed at once);
- a connection with no request under way is closed after ``idle_timeout``;
- once the first byte of a request arrives, its headers must be complete within ``header_timeout``.

The guard wraps aiohttp's protocol factory (``SockSite`` below); the middleware tells it when a request is being
handled. The body of a request is bounded by its handler (``notify/json_body.py``).

With TLS the guard sits *under* the encryption: a connection is counted from ``accept``, before its handshake, and
the handshake itself must finish within ``header_timeout`` (``loop.start_tls`` on the accepted socket). Handing
``ssl=`` to ``create_server`` instead counted a connection only once its handshake was done, so 1100 clients that
never sent a ClientHello held 1100 descriptors the guard never saw.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.web.config import HttpConfig

log = logging.getLogger(__name__)

# Descriptors kept for the daemon itself whatever the cap: NVML worker pipes and its retry workers, SQLite and its
# journal, the notification client's sockets, probes, the kernel log, logging. Measured use is well under 100.
RESERVED_FDS = 256
# asyncio accepts up to ``backlog`` sockets per wake-up before any of them reaches the guard, and a connection
# closed to make room frees its descriptor one loop turn later: two bursts can be in flight beyond the cap.
ACCEPT_BURST = 64
IN_FLIGHT_FDS = 2 * ACCEPT_BURST
# Fewest connections allowed however low the open-file limit: /metrics and /healthz must stay reachable.
MIN_CONNECTIONS = 16
# How often timeouts are checked; closing up to this much late is harmless.
SWEEP_SECONDS = 1.0
CloseReason = str  # "idle_timeout", "header_timeout", "evicted"
CLOSE_REASONS = ("idle_timeout", "header_timeout", "evicted")
# TLS handshakes under way at once; a new one beyond this closes the oldest (its client has been silent longest).
# asyncio gives each TLS connection a 256 KiB read buffer from the start of its handshake: 640 silent ones held
# 160 MB. A real client's handshake takes milliseconds, so 64 at once is far more than scrapers need.
MAX_HANDSHAKING = 64
# Why a TLS handshake did not complete: the client's fault each time, counted and never logged per connection.
HANDSHAKE_FAILURES = ("timeout", "error", "closed")


def effective_limit(configured: int, nofile_soft: int | None = None) -> int:
    """``configured``, held below the open-file soft limit minus what the daemon and accept bursts need (never
    below MIN_CONNECTIONS)."""
    if nofile_soft is None:
        nofile_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if nofile_soft == resource.RLIM_INFINITY:
        return configured
    return max(MIN_CONNECTIONS, min(configured, nofile_soft - RESERVED_FDS - IN_FLIGHT_FDS))


class _Conn:
    """What the guard knows of one open connection."""

    __slots__ = ("busy", "head_started", "last_active", "transport")

    def __init__(self, transport: asyncio.Transport, now: float) -> None:
        self.transport = transport
        self.busy = 0  # requests being handled (pipelining can make it more than one)
        self.last_active = now
        self.head_started: float | None = None  # first byte of a request whose headers are not complete yet


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's per-connection protocol, with the guard told of every arrival, byte and departure."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol, tls: ssl.SSLContext | None) -> None:
        self._guard = guard
        self._inner = inner
        self._tls = tls
        self._conn: _Conn | None = None
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._conn = self._guard.opened(transport)
        if self._conn is None:
            transport.abort()  # refused: every connection is busy (no protocol ever sees it)
            return
        if self._tls is None:
            self._inner.connection_made(transport)
            return
        # Not a byte of the ClientHello may reach us before start_tls puts its SSL protocol in our place.
        transport.pause_reading()
        self._guard.handshake_started(self._conn)
        self._conn.head_started = self._conn.last_active  # the handshake is held to the header deadline
        self._handshake = asyncio.ensure_future(self._start_tls(transport, self._conn, self._tls))

    async def _start_tls(self, raw: asyncio.Transport, conn: _Conn, tls: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            wrapped = await loop.start_tls(raw, self, tls, server_side=True,
                                           ssl_handshake_timeout=self._guard.header_timeout)
        except ConnectionAbortedError:  # the handshake timeout (asyncio's message says so)
            self._guard.handshake_failed(conn, "timeout")
            return
        except (OSError, ValueError, RuntimeError):  # ssl.SSLError is an OSError; a reset peer; a closed transport
            self._guard.handshake_failed(conn, "error")
            return
        if wrapped is None or wrapped.is_closing():  # closed (by the client or the guard) during the handshake
            self._guard.handshake_failed(conn, "closed")
            return
        self._guard.handshake_done(conn, wrapped)
        self._inner.connection_made(wrapped)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is None:
            return
        self._guard.closed(self._conn)
        if self._handshake is not None and not self._handshake.done():
            return  # lost during the handshake: the inner protocol never saw the connection
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is not None:
            conn.last_active = time.monotonic()
            if conn.busy == 0 and conn.head_started is None:
                conn.head_started = conn.last_active
            self._guard.touched(conn)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class ConnectionGuard:
    """Counts, caps and times out the server's connections; see the module docstring."""

    def __init__(self, config: HttpConfig, *, nofile_soft: int | None = None) -> None:
        self.limit = effective_limit(config.max_connections, nofile_soft)
        self.idle_timeout = config.idle_timeout
        self.header_timeout = config.header_timeout
        self._conns: OrderedDict[asyncio.Transport, _Conn] = OrderedDict()  # least recently active first
        self._sweeper: asyncio.TimerHandle | None = None
        self.accepted = 0
        self.refused = 0
        self.closed_by: dict[CloseReason, int] = dict.fromkeys(CLOSE_REASONS, 0)
        self.handshake_failures: dict[str, int] = dict.fromkeys(HANDSHAKE_FAILURES, 0)
        self._refusal_logged = 0.0
        self._handshaking: OrderedDict[_Conn, None] = OrderedDict()  # oldest first
        self.serves_tls = False  # some site handshakes through the guard: the handshake family is exported

    @property
    def open(self) -> int:
        return len(self._conns)

    def protocol_factory(
        self, inner: Callable[[], asyncio.Protocol], tls: ssl.SSLContext | None = None
    ) -> Callable[[], asyncio.Protocol]:
        """Wrap aiohttp's protocol factory (``runner.server``); with ``tls``, the guard does the handshake."""
        self.serves_tls = self.serves_tls or tls is not None
        return lambda: _GuardedProtocol(self, inner(), tls)

    # -- connection events ---------------------------------------------------------------------------------------
    def opened(self, transport: asyncio.Transport) -> _Conn | None:
        if len(self._conns) >= self.limit and not self._evict_one():
            self.refused += 1
            now = time.monotonic()
            if now - self._refusal_logged >= 60.0:
                self._refusal_logged = now
                log.warning(
                    "http: %d connections open, all busy: refusing new ones (http.max_connections, effective %d)",
                    len(self._conns),
                    self.limit,
                )
            return None
        conn = _Conn(transport, time.monotonic())
        self._conns[transport] = conn
        self.accepted += 1
        self._arm()
        return conn

    def closed(self, conn: _Conn) -> None:
        self._conns.pop(conn.transport, None)

    def handshake_started(self, conn: _Conn) -> None:
        self._handshaking[conn] = None
        while len(self._handshaking) > MAX_HANDSHAKING:
            oldest = next(iter(self._handshaking))
            del self._handshaking[oldest]
            self._close(oldest, "evicted")

    def handshake_done(self, conn: _Conn, wrapped: asyncio.Transport) -> None:
        """The TLS handshake finished: from now on the connection is known by its TLS transport (the one requests
        carry), and it is idle, no longer held to the header deadline."""
        self._handshaking.pop(conn, None)
        if self._conns.pop(conn.transport, None) is None:
            return
        conn.transport = wrapped
        conn.head_started = None
        conn.last_active = time.monotonic()
        self._conns[wrapped] = conn

    def handshake_failed(self, conn: _Conn, why: str) -> None:
        self._handshaking.pop(conn, None)
        if conn.transport in self._conns:
            self._conns.pop(conn.transport, None)
            conn.transport.abort()
        self.handshake_failures[why] += 1

    def touched(self, conn: _Conn) -> None:
        if conn.transport in self._conns:
            self._conns.move_to_end(conn.transport)

    def request_started(self, transport: Any) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.busy += 1
            conn.head_started = None

    def request_ended(self, transport: Any) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            conn.last_active = time.monotonic()
            self._conns.move_to_end(transport)

    # -- enforcement -------------------------------------------------------------------------------------------------
    def _evict_one(self) -> bool:
        for conn in self._conns.values():  # least recently active first
            if conn.busy == 0:
                self._close(conn, "evicted")
                return True
        return False

    def _close(self, conn: _Conn, reason: CloseReason) -> None:
        self._conns.pop(conn.transport, None)
        self.closed_by[reason] += 1
        conn.transport.abort()  # no lingering: the descriptor is what we are freeing

    def _arm(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if conn.busy:
                continue
            if conn.head_started is not None and now - conn.head_started > self.header_timeout:
                self._close(conn, "header_timeout")
            elif now - conn.last_active > self.idle_timeout:
                self._close(conn, "idle_timeout")
        if self._conns:
            self._arm()

    def close(self) -> None:
        """Stop the timeout checks (the server closes the connections themselves)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # -- aiohttp and Prometheus ------------------------------------------------------------------------------------
    def middleware(self) -> Middleware:
        """Marks a connection busy while one of its requests is handled (not idle, no header deadline)."""

        @web.middleware
        async def mark_busy(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            transport = request.transport
            self.request_started(transport)
            try:
                return await handler(request)
            finally:
                self.request_ended(transport)

        return mark_busy

    def collector(self) -> Collector:
        return _GuardCollector(self)


OPEN = spec("gpuwatchd_http_connections", "gauge", "HTTP connections open now.")
LIMIT = spec(
    "gpuwatchd_http_connections_limit",
    "gauge",
    "Most HTTP connections open at once: http.max_connections, held below the open-file limit minus a reserve.",
)
ACCEPTED = spec("gpuwatchd_http_connections_accepted_total", "counter", "HTTP connections accepted.")
REFUSED = spec(
    "gpuwatchd_http_connections_refused_total",
    "counter",
    "HTTP connections refused at once: the limit was reached and every open connection was busy with a request.",
)
CLOSED = spec(
    "gpuwatchd_http_connections_closed_total",
    "counter",
    "HTTP connections closed by the server: idle_timeout, header_timeout (request headers too slow), evicted "
    "(the connection idle longest, closed to make room at the limit).",
    labels=["reason"],
)
HANDSHAKES_FAILED = spec(
    "gpuwatchd_http_tls_handshake_failures_total",
    "counter",
    "TLS handshakes that did not complete: timeout (no ClientHello or a slow one within http.header_timeout), error"
    " (not TLS, no shared protocol or cipher, a client certificate refused), closed (by the client or the guard"
    " during the handshake). Counted, never logged per connection.",
    labels=["reason"],
)
CONNECTION_SPECS = (OPEN, LIMIT, ACCEPTED, REFUSED, CLOSED, HANDSHAKES_FAILED)


class _GuardCollector(Collector):
    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Metric]:
        g = self._guard
        fams = Families()
        fams.add(OPEN, (), g.open)
        fams.add(LIMIT, (), g.limit)
        fams.add(ACCEPTED, (), g.accepted)
        fams.add(REFUSED, (), g.refused)
        for reason, n in g.closed_by.items():
            fams.add(CLOSED, (reason,), n)
        if g.serves_tls:
            for reason, n in g.handshake_failures.items():
                fams.add(HANDSHAKES_FAILED, (reason,), n)
        yield from fams.metrics()
