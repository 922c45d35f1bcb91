"""The connection guard in front of the real aiohttp server: the cap (evicting the idle, refusing only when all are
busy), the idle and header timeouts, and the descriptor budget under the open-file limit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuwatchd.web.config import HttpConfig
from gpuwatchd.web.connections import IN_FLIGHT_FDS, MIN_CONNECTIONS, RESERVED_FDS, effective_limit
from gpuwatchd.web.server import HttpServer, start_server

WAIT = 30.0  # generous bound for conditions on a loaded machine; each returns as soon as it holds


def test_effective_limit_stays_under_the_open_file_limit() -> None:
    assert effective_limit(1000, 1024) == 1024 - RESERVED_FDS - IN_FLIGHT_FDS
    assert effective_limit(1000, 65536) == 1000
    assert effective_limit(1000, 100) == MIN_CONNECTIONS


async def _until(cond: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), WAIT)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@contextlib.asynccontextmanager
async def serve(config: HttpConfig, gate: asyncio.Event) -> AsyncIterator[HttpServer]:
    async def slow(request: web.Request) -> web.Response:
        await gate.wait()
        return web.Response(text="done")

    async def fast(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/slow", slow), web.get("/healthz", fast)])
    server = await start_server(app, "127.0.0.1", 0, config, CollectorRegistry())
    try:
        yield server
    finally:
        gate.set()
        await server.runner.cleanup()


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    try:
        return await reader.read()
    finally:
        writer.close()


async def test_idle_connections_are_evicted_and_busy_ones_are_not() -> None:
    gate = asyncio.Event()
    async with serve(HttpConfig(max_connections=MIN_CONNECTIONS), gate) as server:
        guard, port = server.guard, server.port
        busy = [asyncio.ensure_future(_get(port, "/slow")) for _ in range(4)]
        await _until(lambda: guard.open == 4 and all(c.busy for c in guard._conns.values()), "4 busy requests")
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3 * MIN_CONNECTIONS)]
        # A scraper still gets in: the idle connections made room, the busy ones were kept.
        assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 200")
        assert guard.closed_by["evicted"] >= 2 * MIN_CONNECTIONS and guard.refused == 0
        assert guard.open <= guard.limit
        gate.set()
        assert all(body.endswith(b"done") for body in await asyncio.gather(*busy))
        for _, w in idle:
            w.close()


async def test_new_connections_are_refused_only_when_all_are_busy() -> None:
    gate = asyncio.Event()
    async with serve(HttpConfig(max_connections=MIN_CONNECTIONS), gate) as server:
        guard, port = server.guard, server.port
        busy = [asyncio.ensure_future(_get(port, "/slow")) for _ in range(MIN_CONNECTIONS)]
        await _until(lambda: sum(c.busy for c in guard._conns.values()) == MIN_CONNECTIONS, "every slot busy")
        assert await _get(port, "/healthz") == b""  # closed at once, no answer
        assert guard.refused == 1
        gate.set()
        await asyncio.gather(*busy)
        await _until(lambda: guard.open == 0, "the slow requests to finish")
        assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    ("payload", "reason"), [(b"", "idle_timeout"), (b"GET /healthz HTTP/1.1\r\nX-", "header_timeout")]
)
async def test_idle_and_slow_headers_time_out(payload: bytes, reason: str) -> None:
    gate = asyncio.Event()
    async with serve(HttpConfig(idle_timeout=3.0, header_timeout=1.0), gate) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(payload)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed by the server, without an answer
        writer.close()
        assert server.guard.closed_by[reason] == 1
