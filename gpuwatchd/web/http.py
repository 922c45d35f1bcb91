"""The aiohttp application: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/status`` and the status page (``web/``).

Every handler runs on the daemon's event loop and reads only in-memory state, so a hung NVML worker can never
stall a scrape. ``/metrics`` renders the registry on the loop (CPU only) with the encoders of ``encode`` (same bytes
as prometheus_client's, about 4x cheaper). With ``cache_key`` given, the rendered body is reused until the key
changes (the store's version: a new poll, a stale mark, new links...); the families are still built from the store
for every distinct store state. The encoding yields to the loop in short slices (gzip runs in a thread), and scrapes
that arrive during a render get the previous body, so a render never makes the other scrapers wait
(``bench/scrape.py``; ``bench/gc_tail.py --blocks`` shows how long each step holds the loop).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuwatchd.exporter.encode import Encoder, encode_yielding, fast_encoder, openmetrics_latest, text_latest
from gpuwatchd.store import Store
from gpuwatchd.web.page import page_routes
from gpuwatchd.web.status_body import StatusDocument

NOT_READY_REASON = "waiting for the first NVML poll (a snapshot or a definitive NVML failure)"


def ready_from_store(store: Store) -> bool:
    """Ready once the first snapshot, successful or a definitive NVML failure, has been applied."""
    return store.latest is not None


def store_cache_key(store: Store) -> Hashable:
    """Everything the store collector's output depends on: the store version plus the plain runtime attributes."""
    return (
        store.version,
        store.nvml_worker_restarts,
        store.nvml_init_failures,
        store.config_reload_success,
        store.config_reload_timestamp,
    )


# gzip level 1: on the 8 GPU x 32 process page (125 kB) it costs 0.3 ms against level 6's 0.8 ms, for 11.0 kB
# against 9.9 kB; the compression is paid (in a thread) in every re-render, the bytes are loopback or LAN.
GZIP_LEVEL = 1
# Distinct Accept headers whose negotiated encoder is remembered; real scrapers send one or two, the cap only
# bounds what an odd client can make us keep.
ENCODER_CACHE_SIZE = 32
# Previous bodies kept to answer scrapes during a render: one per (format, name filter, gzip) slot in use; real
# scrapers use one or two slots, the cap bounds what odd name filters can make us keep.
PREVIOUS_BODIES = 16

_Slot = tuple[str, tuple[str, ...], bool]  # content type, name[] filter, gzip


class MetricsRenderer:
    """Content negotiation (text 0.0.4 / 1.0.0, OpenMetrics), ``name[]`` filtering, gzip, and the render cache."""

    def __init__(self, registry: CollectorRegistry, cache_key: Callable[[], Hashable] | None = None) -> None:
        self._registry = registry
        self._cache_key = cache_key
        self._key: Hashable = None
        self._cache: dict[_Slot, bytes] = {}
        self._encoders: dict[str, tuple[Callable[[CollectorRegistry], bytes], str]] = {}
        self._pending: dict[_Slot, asyncio.Future[bytes]] = {}  # renders under way on the request path
        self._previous: dict[_Slot, bytes] = {}  # the last body rendered per slot, whatever its key
        self.renders = 0  # how many times the registry was actually collected (tests, bench)
        self.previous_served = 0  # scrapes answered with the previous body while a render was under way

    def _negotiate(self, accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
        negotiated = self._encoders.get(accept)
        if negotiated is None:
            chosen, content_type = choose_encoder(accept)
            negotiated = (fast_encoder(chosen) or chosen, content_type)
            if len(self._encoders) >= ENCODER_CACHE_SIZE:
                self._encoders.clear()
            self._encoders[accept] = negotiated
        return negotiated

    def _current(self) -> None:
        assert self._cache_key is not None
        key = self._cache_key()
        if key != self._key:
            self._cache.clear()
            self._key = key

    def render(self, accept: str, names: Sequence[str] = (), gzipped: bool = False) -> tuple[bytes, str]:
        """The body for an ``Accept`` header value and optional name filter, and its Content-Type."""
        encoder, content_type = self._negotiate(accept)
        if self._cache_key is None:
            return self._encode(encoder, names, gzipped), content_type
        self._current()
        slot = (content_type, tuple(names), gzipped)
        body = self._cache.get(slot)
        if body is None:
            body = self._cache[slot] = self._encode(encoder, names, gzipped)
        return body, content_type

    async def render_async(self, accept: str, names: Sequence[str] = (), gzipped: bool = False) -> tuple[bytes, str]:
        """``render`` for the request path: the encoding yields to the event loop every ``encode.SLICE_SECONDS``,
        and a scrape that arrives while its body is being rendered gets the previous body rather than waiting.

        The scrape that finds the store changed waits for its own render, so a client that scrapes after a change
        always sees it; only scrapes concurrent with a render may get the body of the state just before.
        """
        encoder, content_type = self._negotiate(accept)
        if self._cache_key is None or (encoder is not openmetrics_latest and encoder is not text_latest):
            return self.render(accept, names, gzipped)
        self._current()
        slot = (content_type, tuple(names), gzipped)
        body = self._cache.get(slot)
        if body is not None:
            return body, content_type
        pending = self._pending.get(slot)
        if pending is None:
            pending = self._pending[slot] = asyncio.ensure_future(self._render_slot(self._key, slot, encoder, names))
            pending.add_done_callback(functools.partial(self._render_done, slot))
        else:
            previous = self._previous.get(slot)
            if previous is not None:
                self.previous_served += 1
                return previous, content_type
        # Shielded: a scraper that hangs up must not cancel the render the others are waiting for.
        return await asyncio.shield(pending), content_type

    async def _render_slot(self, key: Hashable, slot: _Slot, encoder: Encoder, names: Sequence[str]) -> bytes:
        self.renders += 1
        registry: Any = self._registry.restricted_registry(names) if names else self._registry
        # Collected in one go, without yielding: the families are one consistent view of the store. Only the
        # encoding of those (now private) families is spread out.
        metrics = list(registry.collect())
        body = await encode_yielding(metrics, encoder)
        if slot[2]:
            # In a thread: zlib lets go of the GIL while it compresses, so the loop serves on meanwhile (the page
            # at 16 GPUs x 256 processes is ~3 MB, 5-15 ms to compress).
            body = await asyncio.to_thread(gzip.compress, body, compresslevel=GZIP_LEVEL)
        if len(self._previous) >= PREVIOUS_BODIES:
            self._previous.clear()
        self._previous[slot] = body
        if self._key == key:
            self._cache[slot] = body
        return body

    def _render_done(self, slot: _Slot, task: asyncio.Future[bytes]) -> None:
        if self._pending.get(slot) is task:
            del self._pending[slot]
        if not task.cancelled():
            task.exception()  # retrieved: the scrapes awaiting it got it (aiohttp answers 500 and logs it)

    def _encode(self, encoder: Callable[[CollectorRegistry], bytes], names: Sequence[str], gzipped: bool) -> bytes:
        self.renders += 1
        registry: Any = self._registry.restricted_registry(names) if names else self._registry
        body = encoder(registry)
        return gzip.compress(body, compresslevel=GZIP_LEVEL) if gzipped else body

    async def handle(self, request: web.Request) -> web.Response:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        gzipped = "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "").lower()
        body, content_type = await self.render_async(accept, request.query.getall("name[]", []), gzipped)
        headers = {hdrs.CONTENT_TYPE: content_type}
        if gzipped:
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        return web.Response(body=body, headers=headers)


# The app's renderer, for embedders that want its render count or to render outside a request.
METRICS_RENDERER: web.AppKey[MetricsRenderer] = web.AppKey("metrics_renderer", MetricsRenderer)
# The app's shared status build (its build count: tests, bench).
STATUS_DOCUMENT: web.AppKey[StatusDocument] = web.AppKey("status_document", StatusDocument)


def _json(data: Any, status: int = 200) -> web.Response:
    # default=str: a stray non-JSON value (a Path, an enum) must not turn the status page into a 500.
    return web.Response(
        text=json.dumps(data, default=str, separators=(",", ":")), status=status, content_type="application/json"
    )


def make_app(
    *,
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
    ready: Callable[[], bool],
    extra_routes: Sequence[web.RouteDef] = (),
    cache_key: Callable[[], Hashable] | None = None,
    status_key: Callable[[], Hashable] | None = None,
) -> web.Application:
    """Build the HTTP app over ``registry`` (never the global one); ``status``/``ready`` are read per request.

    ``cache_key``: a cheap callable whose value changes whenever any registered collector's output may change;
    while it stays equal, ``/metrics`` reuses the rendered body. None renders on every scrape.
    ``status_key``: likewise for ``status`` (``/api/v1/status`` and ``/readyz``): one build per value, shared by the
    requests (``status_body.py``). None builds it for every request.
    """
    metrics = MetricsRenderer(registry, cache_key)
    status_doc = StatusDocument(status, status_key)
    if status_key is not None:  # the daemon's; an embedder without a key builds per request and counts nothing
        registry.register(status_doc.collector())

    async def healthz(request: web.Request) -> web.Response:
        # Answering at all proves the event loop runs; deeper health is /readyz and the metrics.
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            # Ready means "answering with what we know"; say plainly when that is "no GPU data, and why".
            nvml = (await status_doc.current()).doc.get("nvml") or {}
            body: dict[str, Any] = {"ready": True, "nvml_up": nvml.get("ok")}
            if nvml.get("ok") is False:
                body["reason"] = f"NVML unavailable: {nvml.get('error') or 'unknown'}; serving without GPU data"
            return _json(body)
        return _json({"ready": False, "reason": NOT_READY_REASON}, status=503)

    async def api_status(request: web.Request) -> web.Response:
        built = await status_doc.current()
        # 8 GPUs x 10 listed processes is ~40 kB of JSON, ~3 kB gzipped; compressed only for a client that asks for
        # it, once per build, in a thread.
        headers: dict[str, str] = {hdrs.VARY: hdrs.ACCEPT_ENCODING}
        body = built.body
        if "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "").lower():
            body = await status_doc.gzipped(built)
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        return web.Response(body=body, headers=headers, content_type="application/json", charset="utf-8")

    app = web.Application()
    app[METRICS_RENDERER] = metrics
    app[STATUS_DOCUMENT] = status_doc
    app.add_routes(
        [
            *page_routes(),
            web.get("/metrics", metrics.handle),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/api/v1/status", api_status),
            *extra_routes,
        ]
    )
    return app
