"""A real Prometheus server scrapes a simulated daemon; values read back through Prometheus' HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import DaemonProcess, free_port, wait_until

from gpuwatchd.sim.state import make_state

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Prometheus server not installed (Debian package `prometheus`; .ci/run installs it)"
)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``start(target) -> base URL`` of a Prometheus on loopback scraping ``target`` every second."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [{"job_name": "gpuwatchd", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.load(r)
    except OSError:
        return []  # not up yet
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def test_prometheus_scrapes_gpu_memory(
    start_daemon: Callable[..., DaemonProcess],
    prometheus: Callable[[str], str],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
) -> None:
    state = make_state(2)
    state["devices"][0]["memory"]["used"] = 7 * 1024**3
    state["devices"][1]["memory"]["used"] = 11 * 1024**3 + 12345
    d = start_daemon({"nvml": {"library_path": str(standin_libdir), "poll_interval": "200ms"}}, write_sim_state(state))
    base = prometheus(d.url.removeprefix("http://"))

    def two_series() -> list[dict[str, Any]] | None:
        res = query(base, "gpuwatchd_gpu_memory_used_bytes")
        return res if len(res) == 2 else None

    result = wait_until(two_series, "Prometheus to hold both GPUs' memory", timeout=60)
    got = {r["metric"]["uuid"]: float(r["value"][1]) for r in result}
    assert got == {dev["uuid"]: float(dev["memory"]["used"]) for dev in state["devices"]}
    assert all(r["metric"]["job"] == "gpuwatchd" for r in result)
    up = query(base, 'up{job="gpuwatchd"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    # The exposition passed Prometheus' own parser: no scrape errors, and the info series joined by uuid works.
    joined = query(base, "gpuwatchd_gpu_memory_used_bytes * on(uuid) group_left(name) gpuwatchd_gpu_info")
    assert {r["metric"]["name"] for r in joined} == {"NVIDIA A10G"}
