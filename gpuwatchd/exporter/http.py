"""The aiohttp application: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/status`` and a landing page.

Every handler runs on the daemon's event loop and reads only in-memory state: ``/metrics`` runs the registry's
collectors inline (CPU-only, about a millisecond for 8 GPUs; see bench/scrape.py), so a hung NVML worker can
never stall a scrape.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from gpuwatchd.store import Store

NOT_READY_REASON = "waiting for the first NVML poll (a snapshot or a definitive NVML failure)"


def ready_from_store(store: Store) -> bool:
    """Ready once the first snapshot, successful or a definitive NVML failure, has been applied."""
    return store.latest is not None


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
) -> web.Application:
    """Build the HTTP app over ``registry`` (never the global one); ``status``/``ready`` are read per request."""

    async def healthz(request: web.Request) -> web.Response:
        # Answering at all proves the event loop runs; deeper health is /readyz and the metrics.
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return _json({"ready": True})
        return _json({"ready": False, "reason": NOT_READY_REASON}, status=503)

    async def api_status(request: web.Request) -> web.Response:
        return _json(status())

    links = ["/metrics", "/healthz", "/readyz", "/api/v1/status"]
    links += [r.path for r in extra_routes if r.method == "GET" and "{" not in r.path and r.path not in links]

    async def index(request: web.Request) -> web.Response:
        items = "".join(f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in links)
        page = (
            "<!DOCTYPE html><html><head><title>gpuwatchd</title></head><body>"
            f"<h1>gpuwatchd</h1><p>GPU monitoring daemon.</p><ul>{items}</ul></body></html>"
        )
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.add_routes(
        [
            web.get("/", index),
            # prometheus_client's handler: Accept negotiation (text / OpenMetrics), name[] filter, gzip via aiohttp.
            web.get("/metrics", make_aiohttp_handler(registry)),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/api/v1/status", api_status),
            *extra_routes,
        ]
    )
    return app
