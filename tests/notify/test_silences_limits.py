"""Hardening of the silences API through the real aiohttp app: who may write, what a silence may match, how many
and how long; and that user regexes are compiled once, not on every evaluation."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from aiohttp import web

from gpuwatchd.config.loader import ConfigError, config_from_dict
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.notify.matchers import check_regex_safety
from gpuwatchd.runtime.clock import ManualClock

from .conftest import UUID0, make_dispatcher, mk_alert, notify_config

TOKEN = "s3cr3t-write-token-0123"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def serve(d: Dispatcher, host: str = "127.0.0.1") -> tuple[int, web.AppRunner]:
    app = web.Application()
    app.add_routes(d.routes(lambda: []))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    return runner.addresses[0][1], runner


@pytest.fixture
async def api(tmp_path: Path, clock: ManualClock) -> AsyncIterator[tuple[str, Dispatcher]]:
    """A dispatcher with small limits, served on loopback."""
    d = await make_dispatcher(
        notify_config([], api={"max_silences": 2, "max_silence_duration": "2h", "max_regex_length": 40}),
        tmp_path,
        clock,
        start=False,
    )
    port, runner = await serve(d)
    yield f"http://127.0.0.1:{port}", d
    await runner.cleanup()
    d.outbox.close()


def silence(*matchers: Any, **kw: Any) -> dict[str, Any]:
    return {"matchers": list(matchers), "createdBy": "ops", "comment": "maintenance", **kw}


async def post(http: aiohttp.ClientSession, url: str, body: Any, **kw: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/api/v1/silences", json=body, **kw) as r:
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("matchers", "field", "message"),
    [
        (['alertname=~".*"'], "matchers", "matchers: none narrows the silence down"),  # Alertmanager's rule
        (['alertname=~".+"'], "matchers", "matchers: none narrows the silence down"),  # matches any alert too
        (['uuid!="GPU-1"', 'gpu=""'], "matchers", "matchers: none narrows"),
        ([f'uuid="{UUID0}"', 'alertname=~"(a+)+$"'], "matchers[1]", "matchers[1]: nested quantifier"),
        ([f'uuid="{UUID0}"', r'process=~"(x)\\1"'], "matchers[1]", "matchers[1]: backreferences are not supported"),
        (['alertname=~"(?!GpuLost).*"'], "matchers[0]", "matchers[0]: lookaround is not supported"),
        ([f'alertname=~"{"a" * 41}"'], "matchers[0]", "matchers[0]: regex longer than 40 characters"),
        ([{"name": "bad name", "value": "x"}], "matchers[0]", "matchers[0]: invalid label name"),
        (['uuid="x"'] * 17, "matchers", "matchers: at most 16"),
    ],
)
async def test_matchers_that_would_mute_everything_or_stall_are_refused(
    api: tuple[str, Dispatcher], http: aiohttp.ClientSession, matchers: list[Any], field: str, message: str
) -> None:
    url, d = api
    status, body = await post(http, url, silence(*matchers))
    assert status == 400
    assert body["field"] == field and body["error"].startswith(message), body
    assert d.silences.listing(d.now()) == []


async def test_count_duration_and_text_caps(
    api: tuple[str, Dispatcher], http: aiohttp.ClientSession, clock: ManualClock
) -> None:
    url, _ = api
    now = clock.now()
    status, body = await post(http, url, silence('uuid="a"', endsAt=now + 3 * 3600))
    assert (status, body["field"]) == (400, "endsAt") and "at most 2 h (notify.api.max_silence_duration)" in body[
        "error"
    ]
    status, body = await post(http, url, silence('uuid="a"', comment="x" * 2001))
    assert (status, body["field"]) == (400, "comment")
    status, body = await post(http, url, silence('uuid="a"', createdBy=["ops"]))
    assert (status, body["field"]) == (400, "createdBy")

    ids = []
    for u in ("a", "b"):
        status, body = await post(http, url, silence(f'uuid="{u}"', endsAt=now + 2 * 3600))
        assert status == 200
        ids.append(body["silenceID"])
    status, body = await post(http, url, silence('uuid="c"'))
    assert status == 409 and "2 already pending or active (notify.api.max_silences)" in body["error"]
    async with http.delete(f"{url}/api/v1/silences/{ids[0]}") as r:
        assert r.status == 200
    status, _ = await post(http, url, silence('uuid="c"'))  # an expired one frees its place
    assert status == 200

    async with http.post(f"{url}/api/v1/silences", data=b"{" + b" " * 70_000 + b"}") as r:
        assert r.status == 413 and (await r.json())["field"] == "body"


async def test_writes_from_another_host_are_refused_by_default(
    tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession
) -> None:
    addrs = [
        a.address
        for nic in psutil.net_if_addrs().values()
        for a in nic
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not addrs:
        pytest.skip("no non-loopback IPv4 address on this machine to play a remote peer")
    d = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)
    port, runner = await serve(d, "0.0.0.0")
    try:
        remote, local = f"http://{addrs[0]}:{port}", f"http://127.0.0.1:{port}"
        status, body = await post(http, remote, silence('uuid="a"'))
        assert status == 403 and "notify.api.write_from_loopback_only" in body["error"]
        async with http.get(f"{remote}/api/v1/silences") as r:
            assert r.status == 200  # reading stays open, like /metrics
        status, body = await post(http, local, silence('uuid="a"'))  # the local curl workflow
        assert status == 200
        async with http.delete(f"{remote}/api/v1/silences/{body['silenceID']}") as r:
            assert r.status == 403
        assert [s.state(clock.now()) for s in d.silences.listing(clock.now())] == ["active"]

        # Opened to the network: with the token only, and then from anywhere.
        d.reconfigure(notify_config([], api={"write_from_loopback_only": False, "write_token": TOKEN}))
        status, body = await post(http, remote, silence('uuid="b"'))
        assert status == 401 and body["field"] == "Authorization"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, body = await post(http, remote, silence('uuid="b"'), headers=auth)
        assert status == 200
    finally:
        await runner.cleanup()
        await d.stop()


async def test_token_is_required_even_from_loopback_when_set(
    tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession
) -> None:
    d = await make_dispatcher(notify_config([], api={"write_token": TOKEN}), tmp_path, clock, start=False)
    port, runner = await serve(d)
    url = f"http://127.0.0.1:{port}"
    try:
        for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Basic {TOKEN}"}):
            async with http.post(f"{url}/api/v1/silences", json=silence('uuid="a"'), headers=headers) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
                assert TOKEN not in await r.text()
        status, body = await post(http, url, silence('uuid="a"'), headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        async with http.delete(f"{url}/api/v1/silences/{body['silenceID']}") as r:
            assert r.status == 401
        assert d.silences.counts(clock.now())["active"] == 1
    finally:
        await runner.cleanup()
        d.outbox.close()


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ({"write_from_loopback_only": False}, "notify.api: write_from_loopback_only: false needs write_token"),
        ({"write_token": "short"}, "notify.api.write_token: at least 16 characters"),
        ({"max_silences": 0}, "notify.api.max_silences"),
        ({"max_silence_duration": "0s"}, "notify.api.max_silence_duration"),
    ],
)
def test_api_config_is_validated_and_names_the_key(api: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"notify": {"api": {**api, "write_token": api.get("write_token")}}})
    assert message in str(e.value)


def test_write_token_is_a_secret() -> None:
    cfg = config_from_dict({"notify": {"api": {"write_token": TOKEN}}})
    assert TOKEN not in repr(cfg) and TOKEN not in str(cfg.notify.api)


@pytest.mark.parametrize("pattern", ["GPU-.*", "Gpu(Lost|Removed)", "a*b*", "[0-9]+", "(foo|bar)*"])
def test_ordinary_regexes_pass(pattern: str) -> None:
    check_regex_safety(pattern, 256)


async def test_silence_regexes_are_compiled_once(
    api: tuple[str, Dispatcher], http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, d = api
    status, _ = await post(http, url, silence('alertname=~"Gpu(Throttled|Lost)"', 'uuid=~"GPU-0a.*"'))
    assert status == 200

    def no_compiling(*args: object, **kw: object) -> object:
        raise AssertionError("regex compiled while matching")

    monkeypatch.setattr(re, "compile", no_compiling)
    monkeypatch.setattr(re, "fullmatch", no_compiling)
    a = mk_alert(t=d.now())
    assert d.muting(a, d.now()).silenced_by  # matched through the precompiled patterns
    assert not d.muting(mk_alert("GpuXidError", t=d.now()), d.now()).muted
