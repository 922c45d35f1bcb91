"""``/api/v1/status`` is built once per key and shared: concurrent requests, gzip and ``/readyz`` all read one build;
a key change (a new store version) is seen by the next request. On a real socket with a real aiohttp client."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from gpuwatchd.web.http import STATUS_DOCUMENT, make_app
from tests.web.test_http import _start


async def test_concurrent_requests_share_one_build_until_the_key_changes() -> None:
    key = [0]
    calls = [0]

    def status() -> dict[str, Any]:
        calls[0] += 1
        return {"version": 1, "nvml": {"ok": True}, "key": key[0], "gpus": [{"uuid": f"GPU-{i}"} for i in range(500)]}

    registry = CollectorRegistry()
    app = make_app(registry=registry, status=status, ready=lambda: True, status_key=lambda: key[0])
    runner, url = await _start(app)
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as http:

            async def get(path: str, **headers: str) -> tuple[int, bytes, str | None]:
                async with http.get(url + path, headers=headers) as r:
                    return r.status, await r.read(), r.headers.get("Content-Encoding")

            plain = {"Accept-Encoding": "identity"}  # aiohttp's client asks for gzip unless told otherwise
            answers = await asyncio.gather(*(get("/api/v1/status", **plain) for _ in range(200)))
            assert {(a[0], a[2]) for a in answers} == {(200, None)}
            assert len({a[1] for a in answers}) == 1  # one document for all
            zipped = await asyncio.gather(*(get("/api/v1/status", **{"Accept-Encoding": "gzip"}) for _ in range(50)))
            assert {z[2] for z in zipped} == {"gzip"}
            assert {gzip.decompress(z[1]) for z in zipped} == {answers[0][1]}
            ready = await asyncio.gather(*(get("/readyz") for _ in range(50)))
            assert {r[0] for r in ready} == {200}
            assert calls[0] == 1 and app[STATUS_DOCUMENT].builds == 1
            key[0] = 1  # the store changed: the next request sees it
            status_code, body, _ = await get("/api/v1/status", **plain)
            assert status_code == 200 and json.loads(body)["key"] == 1 and calls[0] == 2
        assert registry.get_sample_value("gpuwatchd_http_status_builds_total") == 2
        assert registry.get_sample_value("gpuwatchd_http_status_requests_total") == 301
    finally:
        await runner.cleanup()


async def test_a_build_that_raises_answers_500_and_the_next_request_builds_again() -> None:
    fail = [True]

    def status() -> dict[str, Any]:
        if fail[0]:
            raise RuntimeError("store in a state the status cannot show")
        return {"ok": 1}

    app = make_app(registry=CollectorRegistry(), status=status, ready=lambda: True, status_key=lambda: 0)
    runner, url = await _start(app)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/api/v1/status") as r:
                assert r.status == 500
            fail[0] = False
            async with http.get(url + "/api/v1/status") as r:
                assert r.status == 200 and await r.json() == {"ok": 1}
    finally:
        await runner.cleanup()
