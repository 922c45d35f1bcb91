"""``/api/v1/status`` built once per state and shared by every request that asks for that state.

Building the document walks the store (every GPU, process and history) on the event loop; built per request, 400
concurrent requests held ``/healthz`` 5-8 s and 100 clients pipelining 50 requests each held it 20 s. Here the
document, its JSON bytes and their gzip are built once per ``key`` (the daemon's: the store version, its own
generation counter and a short time bucket, so the parts without a version, the receivers' recent deliveries and
the scenario clock, are at most :data:`STALE_SECONDS` old). Requests that arrive while a build is under way wait for
that one build; they all answer with the same bytes object, so what a request costs is a dictionary lookup and its
share of the socket writes, whatever their number. The gzip runs in a thread (zlib lets go of the GIL).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.exporter.families import Families, spec

# How old the unversioned parts of a served status may be: a bucket of the monotonic clock is part of the key.
STALE_SECONDS = 0.25
# As /metrics (web/http.py GZIP_LEVEL): the bytes are loopback or LAN; level 1 is a third of level 6's CPU.
GZIP_LEVEL = 1


def time_bucket(now: float | None = None) -> int:
    """The current :data:`STALE_SECONDS` bucket of the monotonic clock, for a status key."""
    return int((time.monotonic() if now is None else now) / STALE_SECONDS)


@dataclass
class BuiltStatus:
    """One build: the document (``/readyz`` reads it), its JSON, and its gzip once a client has asked for it."""

    doc: dict[str, Any]
    body: bytes
    gzipped: asyncio.Future[bytes] | None = field(default=None)


class StatusDocument:
    """The shared status build; ``key`` None rebuilds for every request (embedders without a version)."""

    def __init__(self, build: Callable[[], dict[str, Any]], key: Callable[[], Hashable] | None = None) -> None:
        self._build = build
        self._key_of = key
        self._key: Hashable = None
        self._built: BuiltStatus | None = None
        self._pending: asyncio.Future[BuiltStatus] | None = None
        self.builds = 0  # documents actually built
        self.requests = 0  # answers served from a build

    async def current(self) -> BuiltStatus:
        """The build for the current key: cached, the one under way, or a new one."""
        self.requests += 1
        if self._key_of is None:
            return self._make()
        key = self._key_of()
        if self._built is not None and key == self._key:
            return self._built
        if self._pending is None:
            # Built in one go on the loop (the store is one consistent view only there); a task so that requests
            # arriving meanwhile, and a client that hangs up, neither start nor cancel another build.
            self._pending = asyncio.ensure_future(self._build_for(key))
            self._pending.add_done_callback(self._done)
        return await asyncio.shield(self._pending)

    async def _build_for(self, key: Hashable) -> BuiltStatus:
        built = self._make()
        self._built, self._key = built, key
        return built

    def _make(self) -> BuiltStatus:
        self.builds += 1
        doc = self._build()
        # default=str: a stray non-JSON value (a Path, an enum) must not turn the status page into a 500.
        body = json.dumps(doc, default=str, separators=(",", ":")).encode()
        return BuiltStatus(doc, body)

    def _done(self, task: asyncio.Future[BuiltStatus]) -> None:
        if self._pending is task:
            self._pending = None
        if not task.cancelled():
            task.exception()  # retrieved: the requests awaiting it got it (aiohttp answers 500 and logs it)

    @staticmethod
    async def gzipped(built: BuiltStatus) -> bytes:
        """``built``'s JSON gzipped, compressed once per build in a thread, shared by the requests that ask."""
        if built.gzipped is None:
            built.gzipped = asyncio.ensure_future(asyncio.to_thread(gzip.compress, built.body, GZIP_LEVEL))
        return await asyncio.shield(built.gzipped)

    def collector(self) -> Collector:
        return _StatusCollector(self)


BUILDS = spec(
    "gpuwatchd_http_status_builds_total",
    "counter",
    "Times the /api/v1/status document was built: once per store change (or 0.25 s), shared by the requests.",
)
SERVED = spec(
    "gpuwatchd_http_status_requests_total",
    "counter",
    "Requests answered with a status document (/api/v1/status, /readyz).",
)
STATUS_SPECS = (BUILDS, SERVED)


class _StatusCollector(Collector):
    def __init__(self, doc: StatusDocument) -> None:
        self._doc = doc

    def collect(self) -> Iterator[Metric]:
        fams = Families()
        fams.add(BUILDS, (), self._doc.builds)
        fams.add(SERVED, (), self._doc.requests)
        yield from fams.metrics()
