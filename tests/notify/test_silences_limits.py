"""Hardening of the silences API through the real aiohttp app: who may write, what a silence may match, how many
and how long; and that user regexes are compiled once, not on every evaluation."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import re2
from aiohttp import web

from gpuwatchd.config.loader import ConfigError, config_from_dict
from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.notify.matchers import compile_regex
from gpuwatchd.runtime.clock import ManualClock

from .conftest import UUID0, make_dispatcher, mk_alert, notify_config

TOKEN = "s3cr3t-write-token-0123"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def serve(d: Dispatcher, host: str = "127.0.0.1") -> tuple[int, web.AppRunner]:
    app = web.Application()
    app.add_routes(build_routes(d, lambda: []))
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
    d.state.close()


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
        ([f'uuid="{UUID0}"', r'process=~"(x)\\1"'], "matchers[1]", "matchers[1]: invalid regex"),  # RE2: no backrefs
        (['alertname=~"(?!GpuLost).*"'], "matchers[0]", "matchers[0]: invalid regex"),  # RE2: no lookaround
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
        d.state.close()


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


@pytest.mark.parametrize("pattern", ["GPU-.*", "Gpu(Lost|Removed)", "a*b*", "[0-9]+", "(foo|bar)*", "(a+)+$"])
def test_ordinary_regexes_pass(pattern: str) -> None:
    compile_regex(pattern)


async def test_silence_regexes_are_compiled_once(
    api: tuple[str, Dispatcher], http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, d = api
    status, _ = await post(http, url, silence('alertname=~"Gpu(Throttled|Lost)"', 'uuid=~"GPU-0a.*"'))
    assert status == 200

    def no_compiling(*args: object, **kw: object) -> object:
        raise AssertionError("regex compiled while matching")

    for module in (re, re2):
        monkeypatch.setattr(module, "compile", no_compiling)
        monkeypatch.setattr(module, "fullmatch", no_compiling)
    a = mk_alert(t=d.now())
    assert d.muting(a, d.now()).silenced_by  # matched through the precompiled patterns
    assert not d.muting(mk_alert("GpuXidError", t=d.now()), d.now()).muted


# Hostile bodies: every one is a 4xx naming the field, nothing is stored, and the listing keeps answering.
HOSTILE_BODIES: list[tuple[bytes, int, str]] = [
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "startsAt": NaN}', 400, "body"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "endsAt": Infinity}', 400, "body"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "endsAt": 1e400}', 400, "body"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "endsAt": ' + b"9" * 5000 + b"}", 400, "body"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "endsAt": "9999-12-31T23:59:59Z"}', 400, "endsAt"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "startsAt": "+275760-09-13T00:00:00Z"}', 400, "startsAt"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "startsAt": 1e18, "endsAt": 2e18}', 400, "startsAt"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "startsAt": "2030-01-01T00:00:00"}', 400, "startsAt"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "startsAt": true}', 400, "startsAt"),
    (b"[" * 100_000 + b"]" * 100_000, 413, "body"),
    (b"[" * 5000 + b"]" * 5000, 400, "body"),
    (b'{"a":' * 3000 + b"1" + b"}" * 3000, 400, "body"),
    (b"\xff\xfe{}", 400, "body"),
    (b'{"matchers": [{"name": "uuid", "value": "a", "isRegex": "yes"}], "createdBy": "ops"}', 400, "matchers[0]"),
    (b'{"matchers": [{"name": "uuid", "value": "' + b"v" * 5000 + b'"}], "createdBy": "ops"}', 400, "matchers[0]"),
    (b'{"matchers": ["' + b"n" * 300 + b'=\\"a\\""], "createdBy": "ops"}', 400, "matchers[0]"),
    (b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "comment": ' + b'"' + b"c" * 3000 + b'"}', 400, "comment"),
    (b'{"matchers": [["uuid", "a"]], "createdBy": "ops"}', 400, "matchers[0]"),
    (b'"just a string"', 400, "body"),
]


@pytest.mark.parametrize(("raw", "status", "field"), HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
async def test_hostile_silence_bodies_are_refused_and_store_nothing(
    api: tuple[str, Dispatcher], http: aiohttp.ClientSession, raw: bytes, status: int, field: str
) -> None:
    url, d = api
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{url}/api/v1/silences", data=raw, headers=headers) as r:
        body = await r.json()
        assert (r.status, body["field"]) == (status, field), body
    assert d.silences.listing(d.now()) == []
    async with http.get(f"{url}/api/v1/silences") as r:
        assert r.status == 200 and await r.json() == []


async def test_chunked_body_is_capped_by_bytes_read(api: tuple[str, Dispatcher], http: aiohttp.ClientSession) -> None:
    """No Content-Length: the cap counts the bytes that actually arrive."""
    url, d = api

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"matchers": ["uuid=\\"a\\""], "createdBy": "ops", "comment": "'
        for _ in range(200):  # 200 x 1 KiB: well past the 64 KiB cap
            yield b"x" * 1024
        yield b'"}'

    async with http.post(f"{url}/api/v1/silences", data=chunks()) as r:
        assert r.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert r.status == 413 and (await r.json())["field"] == "body"
    assert d.silences.listing(d.now()) == []


@pytest.mark.parametrize(
    "matcher",
    [
        {"name": "alertname", "value": "(.|.)*X", "isRegex": True},
        {"name": "uuid", "value": "(.|.)*X", "isRegex": True},
        {"name": "uuid", "value": "(a|aa)*b", "isRegex": True},
        {"name": "uuid", "value": "(a*)*b", "isRegex": True},
        {"name": "process", "value": "(x+x+)+y", "isRegex": True},
    ],
)
async def test_regex_bombs_match_in_linear_time(
    tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession, matcher: dict[str, Any]
) -> None:
    """Exponential for a backtracking engine on these values (minutes of a blocked loop); RE2 is linear, so the
    POST, every evaluation and a restart with the stored silence all finish at once (the test timeout is the net)."""
    d = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)
    port, runner = await serve(d)
    try:
        url = f"http://127.0.0.1:{port}"
        narrow = {"name": "host", "value": "gpu-host-1"}
        status, body = await post(http, url, silence(matcher, narrow))  # the bomb first: matchers run in order
        assert status == 200, body
        bomb = "a" * 40 if "a" in matcher["value"] else "x" * 40 if "x" in matcher["value"] else "ab" * 20
        for _ in range(3):
            a = mk_alert(bomb, t=d.now(), uuid=bomb, extra={"process": bomb})
            assert not d.muting(a, d.now()).muted
    finally:
        await runner.cleanup()
        d.state.close()
    again = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)  # restart: stored silence loads
    try:
        assert [s.id for s in again.silences.listing(clock.now())] == [body["silenceID"]]
        a = mk_alert("ab" * 20, t=clock.now(), uuid="a" * 40, extra={"process": "x" * 40})
        assert not again.muting(a, clock.now()).muted
    finally:
        again.state.close()


async def test_refused_writes_cannot_flood_the_log(
    tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    d = await make_dispatcher(notify_config([], api={"write_token": TOKEN}), tmp_path, clock, start=False)
    port, runner = await serve(d)
    try:
        with caplog.at_level(logging.DEBUG, logger="gpuwatchd.notify.api"):
            for _ in range(40):
                status, _ = await post(http, f"http://127.0.0.1:{port}", silence('uuid="a"'))
                assert status == 401
        refused = [r for r in caplog.records if "refused a write from" in r.getMessage()]
        assert len(refused) == 40  # each still leaves a trace, at debug level past the first few a minute
        assert len([r for r in refused if r.levelno >= logging.WARNING]) <= 10
    finally:
        await runner.cleanup()
        d.state.close()
