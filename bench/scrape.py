"""/metrics latency with 10 concurrent scrapers, normally and while the NVML worker hangs.

The server runs in its own process (so client work does not share its event loop): the real exporter app over a
store of 8 GPUs x 32 processes, fed a fresh snapshot every second like the daemon's poll. In "hung" mode the
store is marked stale and a supervisor task waits on a worker child that never answers (it sleeps), as the daemon
does when one GPU's NVML calls block; the scrape path must not notice.

Usage: python bench/scrape.py [--requests N] [--scrapers K]
Last line: p50_ms=... p99_ms=... p99_hung_ms=... (targets: p99 <= 5 ms, hung <= 2x normal), plus the uncached
render time of the exposition and p99 with the render cache off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# What Prometheus 2.x sends (scrape.go acceptHeader) and its gzip request.
PROM_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
GPUS = 8
PROCESSES = 32
POLL_SECONDS = 1.0
ROUNDS = 3


def _snapshot(t: float):  # type: ignore[no-untyped-def]
    from gpuwatchd.model import GpuSample, ProcessSample, Snapshot

    gpus = []
    for i in range(GPUS):
        procs = tuple(
            ProcessSample(pid=10_000 + 100 * i + j, used_memory_bytes=(j + 1) << 28, name=f"train_{j}.py",
                          host_rss_bytes=(j + 1) << 29)
            for j in range(PROCESSES)
        )
        gpus.append(
            GpuSample(
                uuid=f"GPU-{i:08x}-1111-4000-8000-000000000000", index=i, name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", memory_total_bytes=85520809984,
                memory_used_bytes=int(40e9 + t % 1000), memory_reserved_bytes=553648128, memory_free_bytes=int(45e9),
                utilization_gpu_ratio=0.9, utilization_memory_ratio=0.4, pstate=0, temperature_celsius=70.0 + i,
                temperature_slowdown_celsius=92.0, temperature_shutdown_celsius=95.0, power_watts=600.0,
                power_limit_watts=700.0, energy_joules=1e8 + t, fan_speed_ratios=None,
                clocks_hz={"graphics": 1.98e9, "sm": 1.98e9, "memory": 2.6e9, "video": 1.7e9},
                max_clocks_hz={"graphics": 1.98e9, "sm": 1.98e9, "memory": 2.6e9, "video": 1.7e9},
                clocks_event_reasons=0, clocks_event_reasons_supported=0x7FF,
                violation_seconds={"power": 1.0, "thermal": 0.0}, ecc_mode_current=True,
                ecc_corrected_volatile=0, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=0,
                ecc_uncorrected_aggregate=0, remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
                remapped_rows_pending=False, remapped_rows_failure=False, pcie_link_generation=5,
                pcie_link_max_generation=5, pcie_link_width=16, pcie_link_max_width=16,
                pcie_tx_bytes_per_second=1e9, pcie_rx_bytes_per_second=1e9, pcie_replay_total=0,
                nvlink_links_active=18, processes=procs, processes_total=PROCESSES,
            )
        )
    return Snapshot(timestamp=t, nvml_ok=True, driver_version="535.161.08", device_count=GPUS, gpus=tuple(gpus))


async def _serve(mode: str, cache: bool) -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from gpuwatchd.exporter.collector import StoreCollector
    from gpuwatchd.exporter.http import make_app, ready_from_store, store_cache_key
    from gpuwatchd.exporter.status import status_from_store
    from gpuwatchd.store import Store

    store = Store()
    store.apply(_snapshot(time.time()))
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    app = make_app(
        registry=registry,
        status=lambda: status_from_store(store),
        ready=lambda: ready_from_store(store),
        cache_key=(lambda: store_cache_key(store)) if cache else None,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)

    async def poll() -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            latest = store.latest
            assert latest is not None
            store.apply(replace(_snapshot(time.time()), gpus=latest.gpus))

    async def hung_supervisor() -> None:
        # The worker blocked in an NVML call: the daemon marks the data stale and waits for the kill deadline.
        worker = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(3600)")
        store.mark_stale()
        try:
            await worker.wait()
        finally:
            worker.kill()

    task = asyncio.create_task(hung_supervisor() if mode == "hung" else poll())
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    task.cancel()
    await runner.cleanup()


async def _scrape(port: int, requests: int, scrapers: int) -> list[float]:
    url = f"http://127.0.0.1:{port}/metrics"
    latencies: list[float] = []
    headers = {"Accept": PROM_ACCEPT, "Accept-Encoding": "gzip"}

    async def one(session: aiohttp.ClientSession, n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            async with session.get(url, headers=headers) as r:
                body = await r.read()
                assert r.status == 200 and body[:2] == b"\x1f\x8b", r.status
            latencies.append(time.perf_counter() - t0)

    # The client does not gunzip: that is the scraper's CPU, not the exporter's latency.
    connector = aiohttp.TCPConnector(limit=scrapers)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await one(session, 20)  # warm-up: connections, first render
        latencies.clear()
        await asyncio.gather(*(one(session, requests // scrapers) for _ in range(scrapers)))
    return latencies


def _run(mode: str, cache: bool, requests: int, scrapers: int) -> list[float]:
    args = [sys.executable, __file__, "--serve", mode] + ([] if cache else ["--no-cache"])
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())
        return asyncio.run(_scrape(port, requests, scrapers))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=10)


def _render_ms() -> float:
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest

    from gpuwatchd.exporter.collector import StoreCollector
    from gpuwatchd.store import Store

    store = Store()
    store.apply(_snapshot(time.time()))
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        generate_latest(registry)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--scrapers", type=int, default=10)
    ap.add_argument("--serve", choices=["normal", "hung"], help=argparse.SUPPRESS)
    ap.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        asyncio.run(_serve(a.serve, cache=not a.no_cache))
        return
    # Interleaved rounds, pooled: other load on a small machine then hits both modes alike.
    normal: list[float] = []
    hung: list[float] = []
    for _ in range(ROUNDS):
        normal += _run("normal", True, a.requests // ROUNDS, a.scrapers)
        hung += _run("hung", True, a.requests // ROUNDS, a.scrapers)
    nocache = _run("normal", False, a.requests // 4, a.scrapers)
    render = _render_ms()
    print(f"{GPUS} GPUs x {PROCESSES} processes, {a.scrapers} concurrent scrapers, {len(normal)} requests per mode")
    print(
        f"p50_ms={_pct(normal, 0.5):.2f} p99_ms={_pct(normal, 0.99):.2f} p99_hung_ms={_pct(hung, 0.99):.2f} "
        f"p50_hung_ms={_pct(hung, 0.5):.2f} p99_nocache_ms={_pct(nocache, 0.99):.2f} render_ms={render:.2f}"
    )


if __name__ == "__main__":
    main()
