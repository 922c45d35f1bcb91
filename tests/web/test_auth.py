"""Basic auth and TLS on the real server (``start_server``): 401 without the password, HTTPS only."""

from __future__ import annotations

import asyncio
import base64
import ssl

import aiohttp
import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from tls_files import TlsFiles

from gpuwatchd.web import auth as auth_module
from gpuwatchd.web.auth import BasicAuth, parse_basic
from gpuwatchd.web.config import HttpConfig
from gpuwatchd.web.http import make_app
from gpuwatchd.web.server import start_server
from gpuwatchd.web.webconfig import parse_web_config

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_parse_basic() -> None:
    token = base64.b64encode(b"alice:pa:ss").decode()
    assert parse_basic(f"Basic {token}") == ("alice", "pa:ss")
    assert parse_basic(f"basic  {token} ") == ("alice", "pa:ss")
    assert parse_basic("Bearer abc") is None
    assert parse_basic("Basic !!!") is None
    assert parse_basic(f"Basic {base64.b64encode(b'no-colon').decode()}") is None
    assert parse_basic(f"Basic {base64.b64encode(bytes([0xff, 0x3a])).decode()}") is None


async def test_successes_are_cached_failures_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = BasicAuth({"alice": HASH})
    try:
        assert await auth.verify("alice", "s3cret")
        assert await auth.verify("alice", "s3cret")
        assert auth.checks == 1  # the second one came from the cache
        assert not await auth.verify("alice", "wrong")
        assert not await auth.verify("alice", "wrong")
        assert auth.checks == 3
        assert not await auth.verify("mallory", "s3cret")  # unknown user: a check too (same time as a wrong one)
        assert auth.checks == 4
        # Bounded: only the most recent successes are kept.
        monkeypatch.setattr(auth_module, "CACHE_SIZE", 1)
        auth._users["bob"] = HASH.encode()
        assert await auth.verify("bob", "s3cret")
        assert await auth.verify("alice", "s3cret")
        assert auth.checks == 6
    finally:
        auth.close()


async def test_a_flood_is_bounded_and_a_cached_login_skips_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks beyond MAX_WAITING are refused at once, a gone client's check is dropped, and a credential that passed
    before is answered from the cache while the queue is full."""
    auth = BasicAuth({"alice": HASH})
    release = asyncio.Event()
    started = 0
    real_check = auth._check

    def slow_check(password: str, hashed: bytes) -> bool:
        nonlocal started
        started += 1
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return real_check(password, hashed)

    loop = asyncio.get_running_loop()
    try:
        assert await auth.verify("alice", "s3cret")  # cached from now on
        monkeypatch.setattr(auth, "_check", slow_check)
        flood = [asyncio.ensure_future(auth.verify("alice", f"wrong{i}")) for i in range(auth_module.MAX_WAITING - 1)]
        gone = asyncio.ensure_future(auth.verify("alice", "wrong-gone", gone=lambda: True))
        await asyncio.sleep(0.1)
        assert await auth.verify("alice", "wrong-extra") is None  # the queue is full: refused, not queued
        assert await auth.verify("alice", "s3cret") is True  # the fast path does not wait
        release.set()
        assert await asyncio.gather(*flood) == [False] * (auth_module.MAX_WAITING - 1)
        assert await gone is None  # dropped: never run
        assert auth.results["refused"] == 1 and auth.results["dropped"] == 1 and auth.results["cached"] == 1
        assert started == auth_module.MAX_WAITING - 1  # the gone client's check was the one not run
    finally:
        auth.close()


async def test_tls_and_basic_auth_protect_every_endpoint(tls_files: TlsFiles) -> None:
    web_config = parse_web_config(
        {
            "tls_server_config": {"cert_file": str(tls_files.cert), "key_file": str(tls_files.key)},
            "basic_auth_users": {"alice": HASH},
        }
    )
    tls = web_config.ssl_context()
    auth = BasicAuth(web_config.basic_auth_users)
    app = make_app(registry=CollectorRegistry(), status=dict, ready=lambda: True)
    server = await start_server(app, "127.0.0.1", 0, HttpConfig(), tls=tls, middlewares=[auth.middleware()])
    client_ctx = ssl.create_default_context(cafile=str(tls_files.cert))
    base = f"https://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as s:
            for path in ("/metrics", "/healthz", "/readyz", "/api/v1/status", "/"):
                async with s.get(base + path) as r:
                    assert r.status == 401, path
                    assert r.headers["WWW-Authenticate"].startswith('Basic realm="gpuwatchd"')
                async with s.get(base + path, headers=basic("alice", "wrong")) as r:
                    assert r.status == 401, path
                async with s.get(base + path, headers=basic("alice", "s3cret")) as r:
                    assert r.status == 200, path
            with pytest.raises(aiohttp.ClientError):  # no plain HTTP on the TLS port
                async with s.get(f"http://127.0.0.1:{server.port}/healthz", headers=basic("alice", "s3cret")):
                    pass
    finally:
        await server.runner.cleanup()
        auth.close()
