"""The local status page: ``GET /`` (HTML) and its assets under ``/static/`` (docs/status-page.md).

Everything the page needs is in the package (``web/static``: the page's script and style, and uPlot, vendored), so
it works on a host without internet. The page is a shell that fills itself from ``/api/v1/status`` and
``/api/v1/alerts``; it has no inline script or style, so its Content-Security-Policy allows scripts, styles and
requests from the daemon alone. The assets are read once, at the first request for the page or one of them (not on
the way to the first /metrics: docs/performance.md, "Start-up"), and served from memory, gzip-compressed when the
client accepts it; the same TLS and basic auth as ``/metrics`` apply (the middlewares guard every route).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import hdrs, web

# Scripts, styles, images and requests from the daemon only; nothing inline, no eval, no framing, no plugins.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
# Assets are named in the page with ?v=<hash of the asset>, so they can be cached for long: a new version of the
# daemon changes the name. The page itself is never cached (it names the assets).
ASSET_MAX_AGE = 86400
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}
# (URL path under /static/, file under gpuwatchd/web/static/)
ASSETS = {
    "app.js": "app.js",
    "app.css": "app.css",
    "favicon.svg": "favicon.svg",
    "uplot/uPlot.iife.min.js": "vendor/uplot/uPlot.iife.min.js",
    "uplot/uPlot.min.css": "vendor/uplot/uPlot.min.css",
    "uplot/LICENSE": "vendor/uplot/LICENSE",
    "uplot/VERSION": "vendor/uplot/VERSION",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    content_type: str
    version: str  # short content hash


def _content_type(name: str) -> str:
    for ext, ct in CONTENT_TYPES.items():
        if name.endswith(ext):
            return ct
    return "text/plain; charset=utf-8"


@functools.cache
def load_assets() -> dict[str, Asset]:
    """The page's files, read from the package once per process."""
    root = resources.files("gpuwatchd.web") / "static"
    out = {}
    for url, rel in ASSETS.items():
        body = (root / rel).read_bytes()
        out[url] = Asset(body, gzip.compress(body, 9), _content_type(rel), hashlib.sha256(body).hexdigest()[:12])
    return out


def render_page(template: str, assets: dict[str, Asset]) -> str:
    """The HTML shell with each ``{{asset:NAME}}`` replaced by its versioned URL."""
    for url, a in assets.items():
        template = template.replace(f"{{{{asset:{url}}}}}", f"/static/{url}?v={a.version}")
    return template


def _respond(request: web.Request, body: bytes, gzipped: bytes, content_type: str, cache: str) -> web.Response:
    headers = {hdrs.CONTENT_TYPE: content_type, hdrs.CACHE_CONTROL: cache, hdrs.VARY: "Accept-Encoding",
               **SECURITY_HEADERS}
    if "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "").lower():
        headers[hdrs.CONTENT_ENCODING] = "gzip"
        body = gzipped
    return web.Response(body=body, headers=headers)


@functools.cache
def _page() -> tuple[bytes, bytes]:
    """The HTML shell with the assets' versioned names, plain and gzip-compressed, built once per process."""
    template = (resources.files("gpuwatchd.web") / "static" / "index.html").read_text(encoding="utf-8")
    page = render_page(template, load_assets()).encode()
    return page, gzip.compress(page, 9)


def page_routes() -> list[web.RouteDef]:
    """``GET /`` and ``GET /static/{name}``."""

    async def index(request: web.Request) -> web.Response:
        page, page_gz = _page()
        return _respond(request, page, page_gz, CONTENT_TYPES[".html"], "no-cache")

    async def static(request: web.Request) -> web.Response:
        a = load_assets().get(request.match_info["name"])
        if a is None:
            raise web.HTTPNotFound(text="no such asset\n", headers=SECURITY_HEADERS)
        return _respond(request, a.body, a.gzipped, a.content_type, f"private, max-age={ASSET_MAX_AGE}")

    return [web.get("/", index), web.get("/static/{name:.+}", static)]
