"""The HTTP API (alerts with muting status, silences create/list/expire) served by a real aiohttp app, and the
secret scan: webhook URLs, HMAC keys and header tokens never appear in logs, metrics, API output or error text."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.config.loader import ConfigError, config_from_dict
from gpuwatchd.config.types import ValidationError, dump
from gpuwatchd.model import Alert
from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import ManualClock, ScaledClock

from .conftest import UUID0, UUID1, Request, Sink, make_dispatcher, mk_alert, notify_config, receiver, settle


async def serve(d: Dispatcher, alerts: list[Alert]) -> tuple[str, web.AppRunner]:
    app = web.Application()
    app.add_routes(build_routes(d, lambda: alerts))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_silence_via_api_mutes_then_expire_unmutes(
    sink: Sink, tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession
) -> None:
    config = notify_config([receiver("hook", "webhook", sink.url)], group_wait="0s", routes=[])
    d = await make_dispatcher(config, tmp_path, clock)
    a0 = mk_alert(t=clock.now())
    a1 = mk_alert(uuid=UUID1, gpu="1", t=clock.now())
    alerts = [a0, a1]
    base, runner = await serve(d, alerts)
    try:
        body = {
            "matchers": [f'uuid="{UUID0}"', {"name": "alertname", "value": "Gpu.*", "isRegex": True}],
            "endsAt": clock.now() + 3600,
            "createdBy": "ops",
            "comment": "maintenance",
        }
        async with http.post(f"{base}/api/v1/silences", json=body) as r:
            assert r.status == 200
            sid = (await r.json())["silenceID"]
        d.update(alerts)
        await settle(d, sink, 1)
        await asyncio.sleep(0.1)
        assert [r.json["commonLabels"]["uuid"] for r in sink.requests] == [UUID1]

        async with http.get(f"{base}/api/v1/alerts") as r:
            listed = {x["labels"]["uuid"]: x for x in await r.json()}
        assert listed[UUID0]["status"] == {"state": "suppressed", "silencedBy": [sid], "inhibitedBy": []}
        assert listed[UUID1]["status"]["state"] == "active"
        assert listed[UUID0]["receivers"] == [{"name": "hook"}]
        for path in ("/api/v1/alerts", "/api/v1/silences"):  # gzip for a client that asks (the status page polls)
            hdrs = {"Accept-Encoding": "gzip"}
            async with http.get(f"{base}{path}", headers=hdrs, auto_decompress=False) as r:
                assert r.headers.get("Content-Encoding") == "gzip", path
                assert json.loads(gzip.decompress(await r.read())) == await (await http.get(f"{base}{path}")).json()

        async with http.get(f"{base}/api/v1/silences") as r:
            [s] = await r.json()
        assert s["status"]["state"] == "active" and s["createdBy"] == "ops"
        assert {"name": "alertname", "value": "Gpu.*", "isRegex": True, "isEqual": True} in s["matchers"]

        clock.advance(300)
        async with http.delete(f"{base}/api/v1/silences/{sid}") as r:
            assert r.status == 200
        async with http.delete(f"{base}/api/v1/silences/{sid}") as r:
            assert r.status == 409  # already expired
        async with http.delete(f"{base}/api/v1/silences/nope") as r:
            assert r.status == 404
        d.update(alerts)  # the silenced alert is news now
        await settle(d, sink, 2)
        assert sink.requests[1].json["commonLabels"]["uuid"] == UUID0
        async with http.get(f"{base}/api/v1/silences") as r:
            assert [x["status"]["state"] for x in await r.json()] == ["expired"]
    finally:
        await runner.cleanup()
        await d.stop()


async def test_silences_survive_restart(tmp_path: Path, clock: ManualClock) -> None:
    from gpuwatchd.notify.matchers import parse_matcher

    d = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)
    s = d.silences.add(
        (parse_matcher('uuid="x"'),),
        starts_at=clock.now(),
        ends_at=clock.now() + 60,
        created_by="me",
        comment="",
        now=clock.now(),
    )
    d.state.close()
    d2 = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)
    assert [x.id for x in d2.silences.listing(clock.now())] == [s.id]
    assert d2.silences.muted_by({"uuid": "x"}, clock.now()) == [s.id]
    d2.state.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"createdBy": "a"}, "matchers: expected a non-empty list"),
        ({"matchers": ["uuid"], "createdBy": "a"}, "matchers[0]: invalid matcher 'uuid'"),
        ({"matchers": ['a="b"']}, "createdBy: required"),
        ({"matchers": ['a="b"'], "createdBy": "a", "endsAt": "yesterday"}, "endsAt: expected an RFC 3339 time"),
        ({"matchers": ['a="b"'], "createdBy": "a", "startsAt": 10, "endsAt": 5}, "endsAt must be after startsAt"),
    ],
)
async def test_bad_silences_are_rejected_with_reason(
    tmp_path: Path, clock: ManualClock, http: aiohttp.ClientSession, body: dict[str, object], message: str
) -> None:
    d = await make_dispatcher(notify_config([]), tmp_path, clock, start=False)
    base, runner = await serve(d, [])
    try:
        async with http.post(f"{base}/api/v1/silences", json=body) as r:
            assert r.status == 400
            assert (await r.json())["error"].startswith(message)
    finally:
        await runner.cleanup()
        d.state.close()


SECRETS = ("T000SECRET", "xyzSECRETtoken", "hmacKEYsecret", "BearerTOKENsecret", "UNREACHABLEpath")


async def test_no_secret_leaks_anywhere(
    sink: Sink, tmp_path: Path, caplog: pytest.LogCaptureFixture, http: aiohttp.ClientSession
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    calls = 0

    def flaky(req: Request) -> web.Response:
        nonlocal calls
        calls += 1
        # Echo the request path in the error body, as some proxies do: it must be redacted before logging.
        return web.Response(status=500, text=f"boom at {req.path}") if calls % 2 else web.Response(text="ok")

    sink.responder = flaky
    receivers = [
        receiver("slack-main", "slack", sink.url),
        receiver(
            "hook",
            "webhook",
            sink.url,
            hmac_secret="hmacKEYsecret",
            headers={"Authorization": "Bearer BearerTOKENsecret"},
        ),
        receiver("dead", "discord", f"http://127.0.0.1:{dead_port}/api/webhooks/1/UNREACHABLEpath"),
        receiver("bad-url", "teams", "http://[::1/UNREACHABLEpath"),
    ]
    # An unparsable URL is rejected without being echoed, in the section's error text and in the loader's.
    with pytest.raises(ValidationError) as exc:
        notify_config(receivers, group_wait="0s")
    with pytest.raises(ConfigError) as cexc:
        config_from_dict({"notify": {"receivers": receivers}})
    assert str(cexc.value) == "<config>: notify.receivers[3].url: not a valid URL"
    assert not [x for x in SECRETS if x in str(exc.value) or x in str(cexc.value)]
    receivers.pop()
    routes = [{"receiver": r["name"], "continue": True} for r in receivers]
    config = notify_config(receivers, group_wait="0s", routes=routes)
    clock = ScaledClock(speed=50)
    d = await make_dispatcher(config, tmp_path, clock)
    base, runner = await serve(d, [])
    try:
        alerts = [mk_alert(t=clock.now()), mk_alert("GpuLost", severity="critical", uuid=UUID1, t=clock.now())]
        d.update(alerts)
        await settle(d, sink, 6)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if any(r.receiver == "dead" and r.attempts >= 2 for r in d.outbox.rows()):
                break
        texts: list[str] = []
        texts += [r.getMessage() for r in caplog.records]
        texts += [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
        reg = CollectorRegistry()
        reg.register(d.collector())
        texts.append(generate_latest(reg).decode())
        for path in ("/api/v1/alerts", "/api/v1/silences"):
            async with http.get(base + path) as r:
                texts.append(await r.text())
        texts += [str(e) for e in d.last_errors().values() if e]
        texts += [r.last_error or "" for r in d.outbox.rows()]
        texts += [repr(config), str(config), msgspec.json.encode(dump(config)).decode()]
        assert any("slack:slack-main: HTTP 500" in t for t in texts)  # the failures were reported...
        assert any("discord:dead" in t for t in texts)
        for secret in SECRETS:  # ...without a trace of a secret
            assert not [t for t in texts if secret in t], secret
        # The signature header was sent and is verifiable with the key.
        from gpuwatchd.notify.webhook import SIGNATURE_HEADER, signature

        signed = [r for r in sink.requests if SIGNATURE_HEADER in r.headers]
        assert signed and all(r.headers[SIGNATURE_HEADER] == signature(r.body, "hmacKEYsecret") for r in signed)
        assert all(r.headers["Authorization"] == "Bearer BearerTOKENsecret" for r in signed)
    finally:
        await runner.cleanup()
        await d.stop()


def test_config_errors_name_the_key_and_hide_the_url() -> None:
    bad = {"notify": {"receivers": [{"name": "a", "type": "slack", "url": "ftp://hooks/T000SECRET"}]}}
    with pytest.raises(ConfigError) as e:
        config_from_dict(bad)
    assert str(e.value) == "<config>: notify.receivers[0].url: not an http(s) URL"
    dup = {"notify": {"receivers": [receiver("a", "slack", "https://x/1"), receiver("a", "slack", "https://x/2")]}}
    with pytest.raises(ConfigError, match=r"receivers\[1\]\.name: duplicate receiver name 'a'"):
        config_from_dict(dup)
    with pytest.raises(ConfigError, match=r"routes\[0\]\.receiver: unknown receiver 'zz'"):
        config_from_dict({"notify": {"routes": [{"receiver": "zz"}]}})
    with pytest.raises(ConfigError, match=r"notify\.routes\[0\]\.matchers: invalid matcher"):
        config_from_dict({"notify": {"routes": [{"matchers": ["severity"]}]}})
    with pytest.raises(ConfigError, match=r"notify\.receivers\[0\]\.type"):
        config_from_dict({"notify": {"receivers": [{"name": "a", "type": "pager", "url": "https://x"}]}})
