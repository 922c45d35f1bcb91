"""Request bodies refused from their headers alone, before a byte of them is decoded (docs/security.md).

No endpoint takes a compressed body, and HTTP/1.1 defines one transfer coding a client may end with: ``chunked``.
aiohttp decodes whatever a request announces on its own, and when a handler answers without reading the body it
reads and drops the rest for up to ``LINGER_SECONDS``: a 1 MiB gzip body that inflates to 1 GiB cost ~3.5 s of
CPU on the event loop that way, even sent to ``GET /healthz``; ``Transfer-Encoding: gzip, chunked`` waited for a
body that could never decode until the body timeout (10 s). So a request with a ``Content-Encoding`` other than
``identity`` gets ``415`` and one with a ``Transfer-Encoding`` other than ``chunked`` gets ``501`` (RFC 9112 6.1),
both at once, and its connection is closed after the answer instead of lingering over the body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.families import Families, spec

REASONS = ("content_encoding", "transfer_encoding")
# The longest header value echoed back in the refusal (the rest is the client's own, and cut).
SHOWN_CHARS = 64


def framing_problem(content_encoding: str | None, transfer_encoding: str | None) -> tuple[str, int, str] | None:
    """``(reason, status, message)`` when a request's body framing is refused, else None."""
    if content_encoding is not None and content_encoding.strip().lower() not in ("", "identity"):
        return ("content_encoding", 415,
                f"Content-Encoding {_shown(content_encoding)!r}: request bodies are not decompressed; send it as is")
    if transfer_encoding is not None and transfer_encoding.strip().lower() != "chunked":
        return ("transfer_encoding", 501,
                f"Transfer-Encoding {_shown(transfer_encoding)!r}: only 'chunked' is understood")
    return None


def _shown(value: str) -> str:
    return value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "..."


class BodyFraming:
    """The middleware that refuses such requests, and their count for ``/metrics``."""

    def __init__(self) -> None:
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)

    def middleware(self) -> Middleware:
        @web.middleware
        async def refuse_framing(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            headers = request.headers
            problem = framing_problem(
                ",".join(headers.getall(hdrs.CONTENT_ENCODING)) if hdrs.CONTENT_ENCODING in headers else None,
                ",".join(headers.getall(hdrs.TRANSFER_ENCODING)) if hdrs.TRANSFER_ENCODING in headers else None,
            )
            if problem is None:
                return await handler(request)
            reason, status, message = problem
            self.refused[reason] += 1
            resp = web.json_response({"error": message}, status=status)
            resp.force_close()
            # Sent here, then the connection is closed: returned to aiohttp with the body unread, it would read
            # (and inflate) the body for the linger time first. Closing flushes the answer written so far.
            await resp.prepare(request)
            await resp.write_eof()
            request.protocol.force_close()
            return resp

        return refuse_framing

    def collector(self) -> Collector:
        return _FramingCollector(self)


REFUSED = spec(
    "gpuwatchd_http_requests_refused_total",
    "counter",
    "HTTP requests refused from their headers before their body was read: content_encoding (a compressed body, "
    "415), transfer_encoding (a transfer coding other than chunked, 501). The connection is closed after the answer.",
    labels=["reason"],
)
FRAMING_SPECS = (REFUSED,)


class _FramingCollector(Collector):
    def __init__(self, framing: BodyFraming) -> None:
        self._framing = framing

    def collect(self) -> Iterator[Metric]:
        fams = Families()
        for reason, n in self._framing.refused.items():
            fams.add(REFUSED, (reason,), n)
        yield from fams.metrics()
