"""The write guard's cross-site checks on the real routes over loopback HTTP (Host allow-list, Origin, Fetch
Metadata, JSON-only bodies), the silence form's token, and the receiver test's token and rate limit. The browser
and DNS-rebinding attacks against a real daemon are in tests/integration/test_cross_site.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.cross_site import LISTEN_HOST, FormTokens
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import ManualClock

from .conftest import Sink, make_dispatcher, notify_config, receiver

TOKEN = "s3cr3t-write-token-0123"
SILENCE = {"matchers": ['uuid="GPU-1"'], "createdBy": "ops", "comment": "c"}


async def serve(d: Dispatcher) -> tuple[str, web.AppRunner]:
    app = web.Application()
    app[LISTEN_HOST] = "GPU-node-7.lan"  # as the daemon's wiring sets it from `listen`
    app.add_routes(build_routes(d, lambda: []))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


@pytest.fixture
async def api(tmp_path: Path, clock: ManualClock, sink: Sink) -> AsyncIterator[tuple[str, Dispatcher]]:
    config = notify_config([receiver("chat", "slack", sink.url, rate_limit_per_minute=3)],
                           external_url="https://gpu.example.org:8443/gpuwatchd")  # fmt: skip
    d = await make_dispatcher(config, tmp_path, clock)
    url, runner = await serve(d)
    yield url, d
    await runner.cleanup()
    await d.stop()


async def post(url: str, path: str, headers: dict[str, str], body: Any = SILENCE) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"Host": "evil.example"}, "Host"),
        ({"Host": "evil.example:1", "Origin": "http://evil.example:1"}, "Host"),
        ({"Host": "localhost.evil.example"}, "Host"),
        ({"Host": "127.0.0.1.evil.example"}, "Host"),
        ({"Host": "gpu.example.org.evil"}, "Host"),
        ({"Host": "gpu-node-7.lan.evil"}, "Host"),
        ({"Origin": "null"}, "Origin"),
        ({"Origin": "http://127.0.0.1:1"}, "Origin"),
        ({"Origin": "https://evil.example"}, "Origin"),
        ({"Origin": "http://gpu.example.org:8443"}, "Origin"),  # external_url's host, another scheme
        ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
        ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
    ],
)
async def test_cross_site_writes_are_refused(api: tuple[str, Dispatcher], headers: dict[str, str], field: str) -> None:
    url, d = api
    status, body = await post(url, "/api/v1/silences", headers)
    assert (status, body["field"]) == (403, field), body
    assert d.silences.listing(d.now()) == []


@pytest.mark.parametrize(
    "headers",
    [
        {},  # the CLI, curl
        {"Host": "localhost"},
        {"Host": "[::1]:9945"},
        {"Host": "gpu.example.org"},  # notify.external_url, behind a proxy that keeps the Host
        {"Host": "gpu-node-7.lan:9945"},  # the listen host, what `gpuwatchd silence` dials by default
        {"Host": "gpu.example.org:8443", "Origin": "https://gpu.example.org:8443", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "SAME"},  # the daemon's own page
    ],
)
async def test_the_daemons_own_names_may_write(api: tuple[str, Dispatcher], headers: dict[str, str]) -> None:
    url, d = api
    if headers.get("Origin") == "SAME":
        headers = {"Origin": url}
    status, body = await post(url, "/api/v1/silences", headers)
    assert status == 200, body
    assert [s.id for s in d.silences.listing(d.now())] == [body["silenceID"]]


async def test_a_body_that_is_not_declared_json_is_refused(api: tuple[str, Dispatcher]) -> None:
    url, d = api
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": ctype} if ctype else {}
        async with aiohttp.ClientSession() as s, s.post(
            f"{url}/api/v1/silences", data=b'{"matchers": ["uuid=\\"a\\""], "createdBy": "x"}', headers=headers,
            skip_auto_headers=["Content-Type"],
        ) as r:
            assert r.status == 415 and (await r.json())["field"] == "Content-Type"
    assert d.silences.listing(d.now()) == []


async def test_the_form_needs_its_token_and_its_page_a_known_host(api: tuple[str, Dispatcher]) -> None:
    url, d = api
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/silences/new?alertname=GpuLost", headers={"Host": "evil.example"}) as r:
            assert r.status == 403 and "csrf_token" not in await r.text()
        async with s.get(f"{url}/silences/new?alertname=GpuLost") as r:
            token = re.search(r'name=csrf_token value="([^"]+)"', await r.text())
        assert token is not None
        form = {"alertname": "GpuLost", "duration": "1h", "author": "erin"}
        for bad in ("", "1.2", FormTokens().issue(), token.group(1) + "0"):
            async with s.post(f"{url}/silences/new", data={**form, "csrf_token": bad}, headers={"Origin": url}) as r:
                assert r.status == 403, bad
        assert d.silences.listing(d.now()) == []
        async with s.post(f"{url}/silences/new", data={**form, "csrf_token": token.group(1)},
                          headers={"Origin": url}) as r:  # fmt: skip
            assert r.status == 200 and "Silenced until" in await r.text()


def test_form_tokens_expire() -> None:
    tokens = FormTokens(b"k" * 32)
    token = tokens.issue(now=1000.0)
    assert tokens.check(token, now=1000.0) is None
    assert "older than an hour" in str(tokens.check(token, now=1000.0 + 3601))
    assert tokens.check("99999999999999." + token.split(".")[1]) is not None


async def test_receiver_tests_need_the_token_and_spend_the_rate_limit(
    tmp_path: Path, clock: ManualClock, sink: Sink
) -> None:
    config = notify_config([receiver("chat", "slack", sink.url, rate_limit_per_minute=3)],
                           api={"write_token": TOKEN})  # fmt: skip
    d = await make_dispatcher(config, tmp_path, clock)
    url, runner = await serve(d)
    try:
        status, body = await post(url, "/api/v1/receivers/test", {}, None)
        assert status == 401 and sink.requests == []
        auth = {"Authorization": f"Bearer {TOKEN}"}
        answers = [await post(url, "/api/v1/receivers/test", auth, None) for _ in range(10)]
        # The clock stands still: the burst (min(5, 3) = 3 tokens) and nothing more.
        assert [s for s, _ in answers] == [200] * 3 + [429] * 7, answers
        assert len(sink.requests) == 3
        assert "NOT SENT: rate_limit_per_minute 3 reached" in answers[-1][1]["results"][0]["line"]
        clock.advance(20.0)  # one token back
        status, body = await post(url, "/api/v1/receivers/test", auth, None)
        assert status == 200 and body["results"][0]["ok"] and len(sink.requests) == 4
    finally:
        await runner.cleanup()
        await d.stop()
