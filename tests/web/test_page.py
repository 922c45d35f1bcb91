"""``GET /`` and ``/static/``: every asset the page names is served from the package (offline), with a strict CSP,
versioned URLs, gzip on request; the vendored chart library keeps its licence and version note."""

from __future__ import annotations

import gzip
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuwatchd.web.page import ASSETS, CSP, load_assets, page_routes


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app.add_routes(page_routes())
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_page_names_only_its_own_assets(client: TestClient[web.Request, web.Application]) -> None:
    resp = await client.get("/")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
    assert resp.headers["Content-Security-Policy"] == CSP and resp.headers["Cache-Control"] == "no-cache"
    html = await resp.text()
    assert "{{" not in html
    assert "<script>" not in html and "style=" not in html and "<style" not in html  # nothing inline
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assets = [r for r in refs if r.startswith("/static/")]
    assert len([r for r in assets if "?v=" in r]) == 5  # favicon, two styles, two scripts: cached per version
    assert not [r for r in refs if "//" in r]  # no CDN, no other host
    for ref in assets:
        a = await client.get(ref)
        assert a.status == 200, ref
        assert a.headers["X-Content-Type-Options"] == "nosniff"
        assert "max-age" in a.headers["Cache-Control"] and "private" in a.headers["Cache-Control"]
        assert len(await a.read()) > 100


async def test_gzip_when_asked_and_404_for_anything_else(client: TestClient[web.Request, web.Application]) -> None:
    plain = await client.get("/static/app.js", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    body = await plain.read()
    raw = await client.get("/static/app.js", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert raw.headers["Content-Encoding"] == "gzip" and gzip.decompress(await raw.read()) == body
    for path in ("/static/nope.js", "/static/../page.py", "/static/vendor/uplot/LICENSE", "/static/"):
        assert (await client.get(path)).status == 404, path


def test_vendored_uplot_has_its_licence_and_version() -> None:
    assets = load_assets()
    assert b"MIT License" in assets["uplot/LICENSE"].body
    assert assets["uplot/uPlot.iife.min.js"].body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert b"uPlot 1.6.32" in assets["uplot/VERSION"].body
    for name in ASSETS:  # no eval-like construct the CSP would refuse
        assert b"new Function(" not in assets[name].body and b"eval(" not in assets[name].body


async def test_the_assets_are_read_at_the_first_request_not_when_the_routes_are_made() -> None:
    """The daemon makes its routes on the way to its first /metrics; the page's files are read (and gzipped) only
    when a browser first asks for the page or one of them, and the same bytes are served from then on."""
    load_assets.cache_clear()
    app = web.Application()
    app.add_routes(page_routes())
    assert load_assets.cache_info().misses == 0
    async with TestClient(TestServer(app)) as c:
        first = await (await c.get("/static/app.css")).read()
        assert load_assets.cache_info().misses == 1
        assert await (await c.get("/static/app.css")).read() == first == load_assets()["app.css"].body
        assert load_assets.cache_info().misses == 1
