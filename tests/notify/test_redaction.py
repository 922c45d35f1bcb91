"""Secrets come back from a receiver in other forms than the configured one: a header value without its scheme, the
credentials of a Basic header decoded, a URL token re-quoted (percent-escapes either case, ``+`` for space,
non-ASCII escaped or not), JSON-escaped. A real HTTP receiver echoes every such form in its error body; no form may
reach the log, the metrics, the API, the notification outbox or the database file."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.notify.api import build_routes
from gpuwatchd.notify.redaction import REDACTED, redact, secret_fragments
from gpuwatchd.runtime.clock import ScaledClock

from .conftest import Request, make_dispatcher, mk_alert, notify_config, receiver, start_sink

# A URL token with a percent-escape, a space, a plus and non-ASCII characters; header secrets of each kind.
URL_TOKEN = "tOk%2Fen päss+wörd ÿ9"
QUERY_TOKEN = "q s€cret/val=9"
BEARER = "bEaRer-TOKEN-0123456789"
BASIC_USER, BASIC_PASSWORD = "hookuser", "pässw0rd:with-colon"
API_KEY = "kEy-ABCDEF-987654"


def forms(secret: str) -> set[str]:
    """Every form in which a service might echo ``secret`` (what the test greps for)."""
    out = {secret, unquote(secret)}
    for s in list(out):
        out |= {quote(s, safe=""), quote(s, safe="/"), quote_plus(s, safe=""), quote(s, safe="!$&'()*+,;=:@/")}
    for s in list(out):
        out |= {s.lower(), s.upper(), json.dumps(s)[1:-1]}
    return {f for f in out if len(f) >= 6}


CORE_SECRETS = [URL_TOKEN, QUERY_TOKEN, BEARER, BASIC_PASSWORD, f"{BASIC_USER}:{BASIC_PASSWORD}", API_KEY]


def echo_everything(received: list[Request]) -> Callable[[Request], web.Response]:
    """A receiver that answers 500 with every header and the path echoed in several encodings."""

    def respond(req: Request) -> web.Response:
        received.append(req)
        auth = req.headers.get("Authorization", "")
        scheme, _, cred = auth.partition(" ")
        lines = [
            f"raw path: {req.path}",
            f"decoded path: {unquote(req.path)}",
            f"plus-quoted: {quote_plus(unquote(req.path))}",
            f"lower hex: {req.path.lower()}",
            f"json: {json.dumps(unquote(req.path))}",
            f"ascii json: {json.dumps(unquote(req.path), ensure_ascii=True)}",
            f"auth: {auth} / without scheme: {cred}",
            f"x-api-key: {req.headers.get('X-Api-Key', '')}",
        ]
        if scheme.lower() == "basic":
            lines.append(f"basic decoded: {base64.b64decode(cred).decode()}")
        # A proxy's error page: long, the secret near the cut of the logged snippet.
        body = "\n".join(lines) + "\n" + "x" * 180 + unquote(req.path)
        return web.Response(status=500, text=body)

    return respond


def test_fragments_cover_every_form() -> None:
    basic = "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
    url = f"http://127.0.0.1:9/hook/{URL_TOKEN}?token={quote(QUERY_TOKEN)}"
    frags = secret_fragments([url, f"Bearer {BEARER}", basic, API_KEY])
    for secret in CORE_SECRETS:
        for f in forms(secret):
            assert redact(f"<<{f}>>", frags) == f"<<{REDACTED}>>", (secret, f)
    idna = secret_fragments(["https://bücher.example/hooks/T0KEN-abcdef123"])
    assert REDACTED in redact("cannot connect to xn--bcher-kva.example/hooks/T0KEN-abcdef123", idna)
    # Ordinary words of a message stay readable.
    assert redact("HTTP 500: internal server error at /hook", frags) == "HTTP 500: internal server error at /hook"


async def test_echoed_secrets_are_redacted_in_logs_metrics_api_and_db(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sink, sink_runner = await start_sink(f"/hook/{quote(URL_TOKEN)}")
    received: list[Request] = []
    sink.responder = echo_everything(received)
    basic = "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()
    url = f"{sink.url}?token={quote(QUERY_TOKEN)}"
    receivers = [
        receiver("bearer", "webhook", url, headers={"Authorization": f"Bearer {BEARER}", "X-Api-Key": API_KEY}),
        receiver("basic", "slack", url, headers={"Authorization": basic}),
    ]
    config = notify_config(
        receivers, group_wait="0s", routes=[{"receiver": "bearer", "continue": True}, {"receiver": "basic"}]
    )
    clock = ScaledClock(speed=50)
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now())])
        for _ in range(400):  # bounded: both receivers retried at least twice
            await asyncio.sleep(0.02)
            rows = d.outbox.rows()
            if len(rows) >= 2 and all(r.attempts >= 2 for r in rows):
                break
        assert {r.headers.get("Authorization") for r in received} == {f"Bearer {BEARER}", basic}
        texts = [r.getMessage() for r in caplog.records]
        texts += [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
        reg = CollectorRegistry()
        reg.register(d.collector())
        texts.append(generate_latest(reg).decode())
        texts += [e for e in d.last_errors().values() if e]
        texts += [r.last_error or "" for r in d.outbox.rows()]
        async with aiohttp.ClientSession() as http:
            app = web.Application()
            app.add_routes(build_routes(d, lambda: []))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            try:
                for path in ("/api/v1/alerts", "/api/v1/silences"):
                    async with http.get(f"http://127.0.0.1:{runner.addresses[0][1]}{path}") as r:
                        texts.append(await r.text())
            finally:
                await runner.cleanup()
        assert any("HTTP 500" in t and REDACTED in t for t in texts)  # the echo was reported, redacted
    finally:
        await d.stop()
        await sink_runner.cleanup()
    db = b"".join(p.read_bytes() for p in tmp_path.glob("gpuwatchd.db*"))
    assert b"HTTP 500" in db  # last_error reached the database
    for secret in CORE_SECRETS:
        for f in forms(secret):
            assert not [t for t in texts if f.lower() in t.lower()], (secret, f)
            assert f.encode() not in db, (secret, f)
