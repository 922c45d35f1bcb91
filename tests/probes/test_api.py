"""``POST /api/v1/probe`` is a write: the silences API's token rule applies; bad requests get a clear 400."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuwatchd.config.types import SecretStr
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
        assert resp.status == 400 and "gpus[0]: expected a string" in (await resp.json())["error"]
    finally:
        await client.close()


# Each was a 500 (TypeError unpacking a non-list, ValueError from int() on Unicode or 4301 digits).
HOSTILE_BODIES = [
    ({"gpus": 5}, "gpus: expected a list"), (True, "expected a JSON object"), (1.5, "expected a JSON object"),
    ({"probes": 7}, "probes: expected a list"), (["²"], "expected a JSON object"), ({"gpus": ["²"]}, "no present GPU"),
    ({"gpus": ["1" * 4301]}, "gpus[0]: expected 1..96 characters"), ({"gpus": ["\uff11\uff13"]}, "no present GPU"),
    ({"gpus": {"a": 1}}, "gpus: expected a list"), ({"gpus": ["0"] * 65}, "at most 64"),
    ({"gpu": ["0"]}, "unknown key"),
    ({"gpus": [""]}, "expected 1..96"), ({"probes": [None]}, "probes[0]: expected a string"),
]


@pytest.mark.parametrize(("body", "error"), HOSTILE_BODIES)
async def test_hostile_bodies_are_400_naming_the_field(tmp_path: Path, body: object, error: str) -> None:
    client = await _client(tmp_path, ApiConfig(write_token=SecretStr(TOKEN)))
    try:
        resp = await client.post("/api/v1/probe", json=body, headers=AUTH)
        assert resp.status == 400
        assert error in (await resp.json())["error"]
    finally:
        await client.close()
