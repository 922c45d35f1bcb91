"""What the HTTP server logs about requests it could not parse: one debug line, rate limited, and a counter.

aiohttp answers a malformed request (bad request line, bad header, bad chunk framing, oversized line...) with a
4xx on its own, and then logs it through its server logger with ``logger.exception``: an ERROR with a full
traceback per request, so anyone who can reach the port can flood the journal. The server is given this logger
instead (``logger=`` of the runner): the client's mistakes become ``DEBUG`` lines, at most ``BURST`` per
``WINDOW_SECONDS`` plus one line saying how many were left out, counted in ``gpuwatchd_http_bad_requests_total``.
Anything else aiohttp reports that way (a bug in a handler: a 500) still goes out as an ERROR with its traceback.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.families import Families, spec

# aiohttp's own server logger, where the errors it does not turn into debug lines go.
SERVER_LOGGER = "aiohttp.server"
# Malformed-request lines logged per window; the rest of the window is counted and summarised in one line.
BURST = 10
WINDOW_SECONDS = 60.0


def _client_error(exc_info: Any) -> BaseException | None:
    """The exception of a log call when it is the client's fault (a request aiohttp could not parse), else None."""
    if exc_info is True:
        exc_info = sys.exc_info()
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
        return exc
    return None


class RequestLogger(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only in typeshed
    """A logger for aiohttp's ``RequestHandler`` (see module docstring)."""

    def __init__(self, base: logging.Logger | None = None, *, clock: Any = time.monotonic) -> None:
        super().__init__(base or logging.getLogger(SERVER_LOGGER), {})
        self._clock = clock
        self.bad_requests = 0
        self._window_start = -WINDOW_SECONDS
        self._in_window = 0
        self._left_out = 0

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = _client_error(exc_info)
        if exc is None:
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)
            return
        self.bad_requests += 1
        now = self._clock()
        if now - self._window_start >= WINDOW_SECONDS:
            if self._left_out:
                self.logger.debug("http: %d more malformed requests in the last %.0f s", self._left_out, WINDOW_SECONDS)
            self._window_start, self._in_window, self._left_out = now, 0, 0
        if self._in_window >= BURST:
            self._left_out += 1
            return
        self._in_window += 1
        # One line, no traceback: what was wrong and from where (args[0] is the peer in aiohttp's message).
        peer = args[0] if args else "?"
        self.logger.debug("http: malformed request from %s: %s", peer, _one_line(exc))

    def collector(self) -> Collector:
        return _BadRequests(self)


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {' '.join(str(text).split())[:200]}"


BAD_REQUESTS = spec(
    "gpuwatchd_http_bad_requests_total",
    "counter",
    "Requests the HTTP server could not parse (bad request line, header or framing), answered 4xx before any handler.",
)


class _BadRequests(Collector):
    def __init__(self, log: RequestLogger) -> None:
        self._log = log

    def collect(self) -> Iterator[Metric]:
        fams = Families()
        fams.add(BAD_REQUESTS, (), self._log.bad_requests)
        yield from fams.metrics()
