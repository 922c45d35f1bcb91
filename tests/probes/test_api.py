"""``POST /api/v1/probe`` is a write: the silences API's token rule applies; bad requests get a clear 400."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from gpuwatchd.notify.config import ApiConfig
from gpuwatchd.probes.api import probe_routes

from .helpers import feed, service

TOKEN = "0123456789abcdef0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _client(tmp_path: Path, api: ApiConfig) -> TestClient:  # type: ignore[type-arg]
    svc, store, clock = service(tmp_path)
    feed(store, clock, 10)
    app = web.Application()
    app.add_routes(probe_routes(svc, lambda: api))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def test_token_is_required_when_set(tmp_path: Path) -> None:
    client = await _client(tmp_path, ApiConfig(write_token=SecretStr(TOKEN)))
    try:
        resp = await client.post("/api/v1/probe", json={"gpus": ["0"], "probes": ["launch"]})
        assert resp.status == 401
        resp = await client.post("/api/v1/probe", json={"probes": ["bogus"]},
                                 headers=AUTH)
        assert resp.status == 400
        assert "unknown probe 'bogus'" in (await resp.json())["error"]
        resp = await client.post("/api/v1/probe", json={"gpus": [3]}, headers=AUTH)
        assert resp.status == 400 and "expected lists of strings" in (await resp.json())["error"]
    finally:
        await client.close()
