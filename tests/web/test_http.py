"""The aiohttp app on a real socket (127.0.0.1, ephemeral port) driven by a real aiohttp client."""

from __future__ import annotations

import asyncio
import gzip
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.model import Snapshot
from gpuwatchd.store import Store
from gpuwatchd.web.http import NOT_READY_REASON, make_app, ready_from_store
from gpuwatchd.web.status import status_from_store
from tests.exporter.conftest import BUILD, UUID_A, registry_for, store_from_fixture

Serve = Callable[[Store], "asyncio.Future[str]"]


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def serve(store: Store, **kw: Any) -> str:
        app = make_app(
            registry=registry_for(store, StoreCollector(store, build=BUILD)),
            status=lambda: status_from_store(store),
            ready=lambda: ready_from_store(store),
            **kw,
        )
        runner, url = await _start(app)
        runners.append(runner)
        return url

    yield serve
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def test_metrics_text_format_by_default(served: Any, client: aiohttp.ClientSession) -> None:
    url = await served(store_from_fixture("store_mixed.json"))
    async with client.get(url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
    assert f'gpuwatchd_gpu_present{{uuid="{UUID_A}"}} 1.0' in text
    assert "# EOF" not in text


async def test_metrics_openmetrics_when_asked(served: Any, client: aiohttp.ClientSession) -> None:
    url = await served(store_from_fixture("store_mixed.json"))
    accept = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5"
    async with client.get(url + "/metrics", headers={"Accept": accept}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = await r.text()
    assert text.endswith("# EOF\n")
    assert "# TYPE gpuwatchd_nvml_worker_restarts counter" in text
    assert "gpuwatchd_nvml_worker_restarts_total 2.0" in text


async def test_metrics_gzip_when_accepted(served: Any, client: aiohttp.ClientSession) -> None:
    url = await served(store_from_fixture("store_mixed.json"))
    async with client.get(url + "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False) as r:
        assert r.headers.get("Content-Encoding") == "gzip"
        body = gzip.decompress(await r.read()).decode()
    assert "gpuwatchd_gpus 2.0" in body


async def test_metrics_name_filter(served: Any, client: aiohttp.ClientSession) -> None:
    url = await served(store_from_fixture("store_mixed.json"))
    async with client.get(url + "/metrics", params=[("name[]", "gpuwatchd_gpus")]) as r:
        text = await r.text()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples == ["gpuwatchd_gpus 2.0"]


async def test_readyz_before_and_after_first_snapshot(served: Any, client: aiohttp.ClientSession) -> None:
    store = Store()
    url = await served(store)
    async with client.get(url + "/readyz") as r:
        assert r.status == 503
        assert await r.json() == {"ready": False, "reason": NOT_READY_REASON}
    # a definitive NVML failure is an answer too: the daemon is ready to report it
    store.apply(Snapshot(timestamp=1.0, nvml_ok=False, nvml_error="library_not_found"))
    async with client.get(url + "/readyz") as r:
        assert r.status == 200
        assert await r.json() == {
            "ready": True,
            "nvml_up": False,
            "reason": "NVML unavailable: library_not_found; serving without GPU data",
        }
    store.apply(Snapshot(timestamp=2.0, nvml_ok=True))
    async with client.get(url + "/readyz") as r:
        assert (r.status, await r.json()) == (200, {"ready": True, "nvml_up": True})
    async with client.get(url + "/healthz") as r:
        assert (r.status, await r.text()) == (200, "ok\n")


async def test_status_json_shape(served: Any, client: aiohttp.ClientSession) -> None:
    url = await served(store_from_fixture("store_mixed.json"))
    async with client.get(url + "/api/v1/status") as r:
        assert r.status == 200
        assert r.content_type == "application/json"
        data = await r.json()
    assert set(data) >= {"nvml", "gpus", "links", "sources", "xid_counts", "recent_xids", "config", "version"}
    assert data["nvml"]["ok"] is True
    states = {g["uuid"][:12]: g["state"] for g in data["gpus"]}
    assert states == {"GPU-aaaaaaaa": "present", "GPU-bbbbbbbb": "present", "GPU-cccccccc": "lost",
                      "GPU-dddddddd": "removed"}
    assert data["gpus"][0]["readings"]["memory_used_bytes"] == 42949672960


async def test_index_links_every_page_and_extra_routes(served: Any, client: aiohttp.ClientSession) -> None:
    async def alerts(request: web.Request) -> web.Response:
        return web.json_response([])

    url = await served(Store(), extra_routes=[web.get("/api/v1/alerts", alerts)])
    async with client.get(url + "/") as r:
        assert r.content_type == "text/html"
        page = await r.text()
    for path in ("/metrics", "/healthz", "/readyz", "/api/v1/status", "/api/v1/alerts"):
        assert f'href="{path}"' in page
    async with client.get(url + "/api/v1/alerts") as r:
        assert await r.json() == []


async def test_scrape_never_waits_on_a_hung_worker(served: Any, client: aiohttp.ClientSession) -> None:
    # A real hung child (like a worker blocked in an NVML call) and a supervisor task waiting on it, as the
    # daemon does; the store is marked stale. Scrapes must complete while the wait is still pending: if the
    # scrape path awaited the worker, these requests would time out (client timeout 10 s, worker sleeps 60 s).
    store = store_from_fixture("store_mixed.json")
    url = await served(store)
    worker = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    supervisor = asyncio.ensure_future(worker.wait())
    try:
        store.mark_stale()
        for _ in range(10):
            async with client.get(url + "/metrics") as r:
                assert r.status == 200
                text = await r.text()
            assert "gpuwatchd_nvml_stale 1.0" in text
            assert f'gpuwatchd_gpu_memory_used_bytes{{uuid="{UUID_A}"}}' in text
        assert not supervisor.done()
    finally:
        worker.kill()
        await supervisor


async def test_status_with_a_non_json_value_still_answers(client: aiohttp.ClientSession) -> None:
    from pathlib import Path

    app = make_app(
        registry=registry_for(Store()),
        status=lambda: {"state_dir": Path("/var/lib/gpuwatchd")},
        ready=lambda: True,
    )
    runner, url = await _start(app)
    try:
        async with client.get(url + "/api/v1/status") as r:
            assert await r.json() == {"state_dir": "/var/lib/gpuwatchd"}
    finally:
        await runner.cleanup()


async def test_metrics_cache_reuses_a_render_until_the_store_changes(client: aiohttp.ClientSession) -> None:
    from gpuwatchd.web.http import METRICS_RENDERER, store_cache_key

    store = store_from_fixture("store_mixed.json")
    app = make_app(
        registry=registry_for(store),
        status=lambda: status_from_store(store),
        ready=lambda: True,
        cache_key=lambda: store_cache_key(store),
    )
    renderer = app[METRICS_RENDERER]
    runner, url = await _start(app)
    try:
        bodies = []
        for _ in range(3):
            async with client.get(url + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
                bodies.append(await r.text())
        assert renderer.renders == 1
        assert bodies[0] == bodies[1] == bodies[2]
        # another format is another render, cached on its own
        async with client.get(url + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
            assert (await r.text()).endswith("# EOF\n")
        assert renderer.renders == 2
        # any store write invalidates: the next scrape shows the new state
        store.mark_stale()
        async with client.get(url + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
            assert "gpuwatchd_nvml_stale 1.0" in await r.text()
        store.nvml_worker_restarts += 1  # a plain attribute, part of the key
        async with client.get(url + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
            assert "gpuwatchd_nvml_worker_restarts_total 3.0" in await r.text()
        assert renderer.renders == 4
    finally:
        await runner.cleanup()


def _renderer(store: Store) -> Any:
    from gpuwatchd.web.http import MetricsRenderer, store_cache_key

    return MetricsRenderer(registry_for(store), lambda: store_cache_key(store))


PROM_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"


@pytest.mark.parametrize("accept", [PROM_ACCEPT, "text/plain;version=0.0.4", ""])
@pytest.mark.parametrize("gzipped", [False, True])
async def test_request_path_render_is_the_same_body(accept: str, gzipped: bool) -> None:
    store = store_from_fixture("store_mixed.json")
    got, got_type = await _renderer(store).render_async(accept, (), gzipped)
    want, want_type = _renderer(store).render(accept, (), gzipped)
    if gzipped:
        got, want = gzip.decompress(got), gzip.decompress(want)
    assert (got, got_type) == (want, want_type)


async def test_scrapes_during_a_render_get_the_previous_body(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwatchd.exporter import encode

    monkeypatch.setattr(encode, "SLICE_SECONDS", 0.0)  # yield after every family, so a render surely spans turns
    store = store_from_fixture("store_mixed.json")
    renderer = _renderer(store)
    old, _ = await renderer.render_async(PROM_ACCEPT)
    store.mark_stale()
    first = asyncio.ensure_future(renderer.render_async(PROM_ACCEPT))
    await asyncio.sleep(0)  # the first scrape has collected and is encoding
    # A scrape during that render is answered at once, from the body before the change ...
    during, _ = await asyncio.wait_for(renderer.render_async(PROM_ACCEPT), timeout=0.5)
    assert not first.done()
    assert during == old and b"gpuwatchd_nvml_stale 0.0" in during
    assert renderer.previous_served == 1
    # ... while the scrape that found the change gets the new state, which later scrapes then share.
    new, _ = await first
    assert b"gpuwatchd_nvml_stale 1.0" in new
    assert (await renderer.render_async(PROM_ACCEPT))[0] == new
    assert renderer.renders == 2


async def test_concurrent_first_scrapes_share_one_render() -> None:
    # With no previous body to give, scrapes during the very first render wait for it rather than render again.
    store = store_from_fixture("store_mixed.json")
    renderer = _renderer(store)
    bodies = await asyncio.gather(*(renderer.render_async(PROM_ACCEPT) for _ in range(5)))
    assert len({b for b, _ in bodies}) == 1 and bodies[0][0].endswith(b"# EOF\n")
    assert renderer.renders == 1 and renderer.previous_served == 0


async def test_a_failing_render_fails_its_scrapes_and_the_next_one_retries() -> None:
    from prometheus_client import CollectorRegistry

    from gpuwatchd.web.http import MetricsRenderer

    class Flaky:
        calls = 0

        def collect(self) -> list[Any]:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("collector broke")
            return []

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Flaky())  # type: ignore[arg-type]
    renderer = MetricsRenderer(registry, lambda: 1)
    with pytest.raises(RuntimeError, match="collector broke"):
        await renderer.render_async(PROM_ACCEPT)
    assert (await renderer.render_async(PROM_ACCEPT))[0] == b"# EOF\n"
