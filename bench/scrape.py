"""/metrics latency with 10 concurrent scrapers against the real daemon under ``gpuwatchd sim``, normally and while
one GPU's NVML calls hang.

    python bench/scrape.py [--seconds 15] [--rounds 2] [--scrapers 10] [--in-process] [--compat dcgm]

Normal: ``gpuwatchd sim`` on the built-in ``fleet`` scenario cut to 8 GPUs x 32 processes (``processes.top_n: 32``,
so all 32 are exported: 8 x 32 per-process series on every page), polling every second as configured by default.
Hung: the same fleet with the ``nvml-hang`` scenario's timeline added (from t=5 s every NVML call on GPU 1 blocks
for 60 s): scraping starts once the daemon has seen the hang (GPU 1 shown lost) and must end
inside the hang window, which the bench checks. The comparison is the same page size, hang or not.

Each scraper is a closed loop (next request when the last answered) sending what Prometheus sends (its Accept
header, gzip); the client does not gunzip (that is the scraper's CPU, not the exporter's latency). Rounds of both
modes are interleaved and pooled, so other load on a small machine hits both alike.

``--compat dcgm`` runs the daemon with ``exporter.compat: dcgm`` (docs/dcgm-compat.md): the same page plus the
``DCGM_FI_*`` families, against the same target.

``--in-process`` instead serves the exporter app alone (no NVML worker, no rules, no dispatcher) over a store fed a
synthetic 8 x 32 snapshot every second, as the first-round bench did: it isolates the exporter from the daemon.

Last line: ``p50_ms=… p99_ms=… p99_hung_ms=…`` (targets: p99 <= 5 ms, hung <= 2x normal), then the request counts,
``p99_healthz_ms`` (the same scrapers on /healthz, which renders nothing: the floor that the daemon's other work on
its event loop and the machine's load set), the page size, and in-process medians of an OpenMetrics render of the
page after a new snapshot with our encoder (``render_ms``) and with prometheus_client's (``render_library_ms``), and
of a re-render with the same snapshot (``rerender_ms``; per-GPU families are reused).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.sim.scenario import SCENARIO_DIR, load_scenario  # noqa: E402

# What Prometheus 2.x sends (scrape.go acceptHeader) and its gzip request.
PROM_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
HEADERS = {"Accept": PROM_ACCEPT, "Accept-Encoding": "gzip"}
GPUS = 8
PROCESSES = 32
HUNG_GPU = 1  # the GPU nvml-hang.yml wedges
HANG_END_S = 65.0  # nvml-hang.yml: the calls return normally again at t=65 s
WARMUP_S = 3.0  # a few polls and renders before measuring: connections open, caches warm, worker settled
START_TIMEOUT_S = 60.0

_PRESENT = re.compile(r'^gpuwatchd_gpu_present\{uuid="([^"]+)"\} (\S+)$', re.MULTILINE)
_PROC_SERIES = re.compile(r"^gpuwatchd_gpu_process_memory_used_bytes\{", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scenario_file(tmp: Path, hung: bool) -> Path:
    """The fleet scenario at 8 x 32, plus the nvml-hang timeline when ``hung``; checked by the real loader."""
    data: dict[str, Any] = yaml.safe_load((SCENARIO_DIR / "fleet.yml").read_text())
    data["name"] = "bench-fleet-hung" if hung else "bench-fleet"
    data["gpus"] = GPUS
    data["processes"]["per_gpu"] = PROCESSES
    if hung:
        hang: dict[str, Any] = yaml.safe_load((SCENARIO_DIR / "nvml-hang.yml").read_text())
        data["timeline"] = [*data["timeline"], *hang["timeline"]]
    path = tmp / f"{data['name']}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    load_scenario(path)  # fail here, with the loader's message, if the scenarios changed shape
    return path


# ``gpuwatchd sim`` itself, minus the CLI's check that the scenario is a built-in name (the runner loads files).
_SIM = (
    "import asyncio, sys; from pathlib import Path; from gpuwatchd.sim.runner import run_sim; "
    "sys.exit(asyncio.run(run_sim(scenario=sys.argv[1], from_xml=None, gpus=None, speed=1.0, listen=sys.argv[3], "
    "config_path=Path(sys.argv[2]), state_dir=None)))"
)


OPTIONS: dict[str, str | None] = {"compat": None}  # --compat: exporter.compat of the daemon under test


class Sim:
    """``gpuwatchd sim`` (its runner) as a subprocess on a free loopback port."""

    def __init__(self, tmp: Path, hung: bool) -> None:
        cfg = tmp / "config.yml"
        cfg.write_text(yaml.safe_dump({"processes": {"top_n": PROCESSES},
                                       **({"exporter": {"compat": OPTIONS["compat"]}} if OPTIONS["compat"] else {})}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (tmp / f"sim-{'hung' if hung else 'normal'}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SIM, str(scenario_file(tmp, hung)), str(cfg), self.url.removeprefix("http://")],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.started = time.monotonic()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def _page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/metrics", headers=HEADERS) as r:
        r.raise_for_status()
        return await r.text()  # this session decompresses


async def _wait_for(session: aiohttp.ClientSession, sim: Sim, ok: Callable[[str], bool], what: str) -> str:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if sim.proc.poll() is not None:
            raise SystemExit(f"gpuwatchd sim exited with {sim.proc.returncode} (log: {sim.log.name})")
        try:
            page = await _page(session, sim.url)
            if ok(page):
                return page
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit(f"gpuwatchd sim: {what} not seen within {START_TIMEOUT_S:.0f} s (log: {sim.log.name})")


def _full(page: str) -> bool:
    present = _PRESENT.findall(page)
    return len(present) == GPUS and all(v == "1.0" for _, v in present) and len(_PROC_SERIES.findall(page)) == \
        GPUS * PROCESSES


def _hanging(page: str) -> bool:
    """The worker has set GPU 1 aside and, past poll_timeout, shows it lost (no worker restart is involved)."""
    absent = [u for u, v in _PRESENT.findall(page) if v != "1.0"]
    return len(absent) == 1


async def _load(url: str, seconds: float, scrapers: int, gzipped: bool = True) -> list[float]:
    """Closed-loop scrapers for ``seconds``; latency of every request answered in that time."""
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def one(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with session.get(url, headers=HEADERS) as r:
                body = await r.read()
                assert r.status == 200 and (body[:2] == b"\x1f\x8b" or not gzipped), r.status
            latencies.append(time.perf_counter() - t0)

    connector = aiohttp.TCPConnector(limit=scrapers)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await asyncio.gather(*(one(session) for _ in range(scrapers)))
    return latencies


async def _measure_sim(
    tmp: Path, hung: bool, seconds: float, scrapers: int, healthz: list[float]
) -> tuple[list[float], int]:
    sim = Sim(tmp, hung)
    try:
        async with aiohttp.ClientSession() as session:
            page = await _wait_for(session, sim, _full, f"{GPUS} GPUs x {PROCESSES} processes")
            if hung:
                page = await _wait_for(session, sim, _hanging, f"the hang of GPU {HUNG_GPU} (1 GPU shown lost)")
            await asyncio.sleep(WARMUP_S)
            # The hang must last the whole measurement, else "hung" would measure a recovered daemon.
            if hung and time.monotonic() - sim.started + seconds > HANG_END_S - 5:
                raise SystemExit(f"--seconds {seconds:g} does not fit in the hang window (t=5..{HANG_END_S:g} s)")
            latencies = await _load(f"{sim.url}/metrics", seconds, scrapers)
            if not hung:
                healthz += await _load(f"{sim.url}/healthz", seconds / 3, scrapers, gzipped=False)
            after = await _page(session, sim.url)
            if hung and not _hanging(after):
                raise SystemExit("the hang ended before the measurement did; use fewer --seconds")
        return latencies, len(page.encode())
    finally:
        sim.stop()


# -- the in-process variant: the exporter app alone over a synthetic store -------------------------------------


def _snapshot(t: float) -> Any:
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


def _store_registry() -> Any:
    from prometheus_client import CollectorRegistry

    from gpuwatchd.exporter.collector import StoreCollector
    from gpuwatchd.store import Store

    store = Store()
    store.apply(_snapshot(time.time()))
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    if OPTIONS["compat"] == "dcgm":
        from gpuwatchd.exporter.dcgm_compat import DcgmCompatCollector

        registry.register(DcgmCompatCollector(store, "bench-host"))
    return store, registry


async def _serve(mode: str) -> None:
    from aiohttp import web

    from gpuwatchd.web.http import make_app, ready_from_store, store_cache_key
    from gpuwatchd.web.status import status_from_store

    store, registry = _store_registry()
    app = make_app(registry=registry, status=lambda: status_from_store(store), ready=lambda: ready_from_store(store),
                   cache_key=lambda: store_cache_key(store))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)

    async def poll() -> None:
        while True:
            await asyncio.sleep(1.0)
            latest = store.latest
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


def _measure_in_process(mode: str, seconds: float, scrapers: int) -> tuple[list[float], int]:
    server = subprocess.Popen([sys.executable, __file__, "--serve", mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdin is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/metrics"
        time.sleep(WARMUP_S)
        return asyncio.run(_load(url, seconds, scrapers)), 0
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=10)


def _render_ms() -> tuple[float, float, float]:
    """Median OpenMetrics render of the 8 x 32 page: a new snapshot with our encoder, the same with
    prometheus_client's, and a re-render of an unchanged snapshot with ours (per-GPU families reused)."""
    from prometheus_client.openmetrics.exposition import generate_latest

    from gpuwatchd.exporter.encode import openmetrics_latest

    store, registry = _store_registry()
    out = []
    for encode, fresh in ((openmetrics_latest, True), (generate_latest, True), (openmetrics_latest, False)):
        times = []
        for _ in range(30):
            if fresh:
                store.apply(_snapshot(time.time()))  # new GpuSample objects, as every poll brings
            t0 = time.perf_counter()
            encode(registry)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) * 1e3)
    return out[0], out[1], out[2]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scrapers", type=int, default=10)
    ap.add_argument("--in-process", action="store_true", help="the exporter app alone over a synthetic store")
    ap.add_argument("--compat", choices=["dcgm"], help="exporter.compat for the daemon (not with --in-process)")
    ap.add_argument("--serve", choices=["normal", "hung"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    OPTIONS["compat"] = a.compat
    if a.serve:
        asyncio.run(_serve(a.serve))
        return
    normal: list[float] = []
    hung: list[float] = []
    healthz: list[float] = []  # /healthz under the same daemon: the floor the event loop and the machine set
    page_bytes = 0
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp_name:
        for _ in range(a.rounds):
            for mode, into in (("normal", normal), ("hung", hung)):
                if a.in_process:
                    lat, size = _measure_in_process(mode, a.seconds, a.scrapers)
                else:
                    lat, size = asyncio.run(
                        _measure_sim(Path(tmp_name), mode == "hung", a.seconds, a.scrapers, healthz)
                    )
                into.extend(lat)
                page_bytes = max(page_bytes, size)
                print(f"{mode}: {len(lat)} requests, p50 {_pct(lat, 0.5):.2f} ms, p99 {_pct(lat, 0.99):.2f} ms",
                      flush=True)
    render, render_library, rerender = _render_ms()
    where = "exporter app in-process" if a.in_process else "gpuwatchd sim (fleet 8x32; nvml-hang timeline)"
    print(f"{where}: {GPUS} GPUs x {PROCESSES} processes, {a.scrapers} concurrent scrapers, {a.rounds} rounds")
    print(
        f"p50_ms={_pct(normal, 0.5):.2f} p99_ms={_pct(normal, 0.99):.2f} p99_hung_ms={_pct(hung, 0.99):.2f} "
        f"p999_ms={_pct(normal, 0.999):.2f} p999_hung_ms={_pct(hung, 0.999):.2f} p50_hung_ms={_pct(hung, 0.5):.2f} "
        f"requests={len(normal)} "
        f"requests_hung={len(hung)} "
        f"p99_healthz_ms={_pct(healthz, 0.99):.2f} p999_healthz_ms={_pct(healthz, 0.999):.2f} "
        f"page_bytes={page_bytes} render_ms={render:.2f} "
        f"render_library_ms={render_library:.2f} rerender_ms={rerender:.2f}"
    )


if __name__ == "__main__":
    main()
