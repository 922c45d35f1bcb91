"""Fleet capacity: series per GPU and per host, scrape size, per-process series churn, and from those the Prometheus
and VictoriaMetrics sizing for a fleet (docs/fleet.md, "Sizing").

    python bench/fleet.py [--hosts 1000] [--gpus 8] [--interval 30] [--window 600] [--speed 20]

Two real daemons under ``gpuwatchd sim``, each with the default config (``processes.top_n: 10``):
``default``, the ``idle`` scenario on ``--gpus`` GPUs (a quiet host: the floor), and ``fleet`` on ``--gpus`` GPUs
(256 processes per GPU with 2 per GPU replaced every 30 s: the busy shared node, the ceiling). Each is scraped as
Prometheus scrapes (its Accept header) once the first poll is in, then every scenario second for ``--window``
scenario seconds (at ``--speed``): the series on the page (samples; a histogram bucket is a series), how many
carry a ``uuid`` (per GPU) or a ``pid`` (per process), the page's bytes plain and gzip-compressed, and every series
key seen during the window: per-process series born during it are the churn (bounded by ``processes.top_n`` per
GPU: a process outside the top N by memory has no series).

Sizing, for ``--hosts`` hosts scraped every ``--interval`` s, from the ``fleet`` page (the worst case):
active series, samples per second, scrape bandwidth, new series per day from process churn, and storage from the
engines' documented rates: Prometheus 1-2 bytes per sample on disk (prometheus.io/docs/prometheus/latest/storage,
"Operational aspects"; 2 taken), VictoriaMetrics < 1 byte per sample (docs.victoriametrics.com, "Capacity
planning"; 0.8 taken, measured ~0.4 on typical data). Memory: Prometheus' head holds every active series (a rough
4 KiB each with its index and chunks, the usual planning figure), VictoriaMetrics ~1 KiB per active series (its
"1 GB of RAM per 1 million active series" guide). These are planning figures to start from, to be checked with
``prometheus_tsdb_head_series`` and ``process_resident_memory_bytes`` once the fleet runs.

Last line: ``series_per_gpu_default series_per_host_default series_per_gpu_fleet series_per_host_fleet
scrape_kb_fleet scrape_gzip_kb_fleet churn_series_per_host_hour active_series samples_per_s prom_disk_gb_per_day
prom_ram_gb vm_disk_gb_per_day vm_ram_gb`` (plus the default config's scrape sizes).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
PROM_BYTES_PER_SAMPLE = 2.0
VM_BYTES_PER_SAMPLE = 0.8
PROM_BYTES_PER_SERIES = 4096
VM_BYTES_PER_SERIES = 1024
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Page:
    series: int
    gpu_series: int
    process_series: int
    plain_bytes: int
    gzip_bytes: int


@dataclass
class Run:
    name: str
    gpus: int
    pages: list[Page] = field(default_factory=list)
    seen: set[SeriesKey] = field(default_factory=set)
    first: set[SeriesKey] = field(default_factory=set)
    scenario_seconds: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> tuple[Page, set[SeriesKey]]:
    req = urllib.request.Request(url, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        encoding = r.headers.get("Content-Encoding", "")
    plain = gzip.decompress(raw) if encoding == "gzip" else raw
    gz = len(raw) if encoding == "gzip" else len(gzip.compress(raw, 6))
    text = plain.decode()
    if text.rstrip().endswith("# EOF"):  # OpenMetrics: the classic parser reads the same samples
        text = re.sub(r"# EOF\s*$", "", text)
    keys: set[SeriesKey] = set()
    gpu = proc = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            keys.add((s.name, tuple(sorted(s.labels.items()))))
            gpu += "uuid" in s.labels
            proc += "pid" in s.labels
    return Page(len(keys), gpu, proc, len(plain), gz), keys


def measure(name: str, scenario: str, gpus: int, window: float, speed: float) -> Run:
    port = free_port()
    run = Run(name, gpus)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sim.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", scenario, "--gpus", str(gpus),
                 "--speed", f"{speed:g}", "--listen", f"127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{name}: sim exited:\n{log.read_text()}")
                try:
                    page, keys = scrape(url)
                    if page.gpu_series and ("fleet" not in scenario or page.process_series):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: no GPU series after 120 s:\n{log.read_text()}")
                time.sleep(0.2)
            time.sleep(2.0 / speed + 1.0)  # a couple more polls: every family has its first reading
            page, keys = scrape(url)
            run.first = keys
            t0 = time.monotonic()
            while (time.monotonic() - t0) * speed < window:
                page, keys = scrape(url)
                run.pages.append(page)
                run.seen |= keys
                time.sleep(max(0.05, 1.0 / speed))
            run.scenario_seconds = (time.monotonic() - t0) * speed
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return run


def median(xs: list[int]) -> float:
    s = sorted(xs)
    return float(s[len(s) // 2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=30.0, help="scrape interval of the sizing, seconds")
    ap.add_argument("--window", type=float, default=600.0, help="scenario seconds of scraping (churn window)")
    ap.add_argument("--speed", type=float, default=20.0)
    args = ap.parse_args()

    runs = [measure("default", "idle", args.gpus, args.window, args.speed),
            measure("fleet", "fleet", args.gpus, args.window, args.speed)]  # fmt: skip
    figures: dict[str, float] = {}
    for r in runs:
        series = median([p.series for p in r.pages])
        gpu = median([p.gpu_series for p in r.pages])
        proc = median([p.process_series for p in r.pages])
        plain = median([p.plain_bytes for p in r.pages])
        gz = median([p.gzip_bytes for p in r.pages])
        # Churn: per-process series born during the window (a process starting, or entering the top-N); other
        # series born after the first scrape are one-time (a family's first reading, a probe's first run).
        new = len([k for k in r.seen - r.first if any(name == "pid" for name, _ in k[1])])
        births = len(r.seen - r.first) - new
        churn_hour = new / r.scenario_seconds * 3600
        print(f"{r.name}: {r.gpus} GPUs, {series:.0f} series ({gpu:.0f} per-GPU = {gpu / r.gpus:.0f}/GPU, "
              f"{proc:.0f} per-process, {series - gpu:.0f} host-level); page {plain / 1024:.1f} KiB, "
              f"gzip {gz / 1024:.1f} KiB; {new} new per-process series in {r.scenario_seconds:.0f} scenario s "
              f"({churn_hour:.0f}/h), {births} other series born once")  # fmt: skip
        figures[f"series_per_gpu_{r.name}"] = round(gpu / r.gpus, 1)
        figures[f"series_per_host_{r.name}"] = series
        figures[f"scrape_kb_{r.name}"] = round(plain / 1024, 1)
        figures[f"scrape_gzip_kb_{r.name}"] = round(gz / 1024, 1)
        figures[f"churn_series_per_host_hour_{r.name}"] = round(churn_hour)

    per_host = figures["series_per_host_fleet"]
    active = args.hosts * per_host
    samples_s = active / args.interval
    churn_day = args.hosts * figures["churn_series_per_host_hour_fleet"] * 24
    figures.update({
        "active_series": active,
        "samples_per_s": round(samples_s),
        "churn_series_per_day": churn_day,
        "scrape_mbit_s": round(args.hosts * figures["scrape_gzip_kb_fleet"] * 1024 * 8 / args.interval / 1e6, 1),
        "prom_disk_gb_per_day": round(samples_s * 86400 * PROM_BYTES_PER_SAMPLE / 1e9, 1),
        "prom_ram_gb": round((active + churn_day / 12) * PROM_BYTES_PER_SERIES / 1e9, 1),  # head: ~2 h of churn
        "vm_disk_gb_per_day": round(samples_s * 86400 * VM_BYTES_PER_SAMPLE / 1e9, 1),
        "vm_ram_gb": round((active + churn_day / 24) * VM_BYTES_PER_SERIES / 1e9, 1),  # ~1 h of churn active
    })  # fmt: skip
    print(f"sizing: {args.hosts} hosts x {args.gpus} GPUs (fleet page), scrape every {args.interval:g} s")
    print(" ".join(f"{k}={v:g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
