"""A real Prometheus server scrapes a simulated daemon; values read back through Prometheus' HTTP API."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
import yaml
from support import ROOT, START_SECONDS, DaemonProcess, free_port, wait_until
from tls_files import TlsFiles

from gpuwatchd.sim.state import make_state

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Prometheus server not installed (Debian package `prometheus`; .ci/run installs it)"
)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``start(target, **job) -> base URL`` of a Prometheus on loopback scraping ``target`` every second; ``job``
    adds keys to the scrape job (``scheme``, ``tls_config``, ``basic_auth``)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str, **job: Any) -> str:
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {"job_name": "gpuwatchd", "static_configs": [{"targets": [target]}], **job}
                    ],
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


async def test_prometheus_scrapes_over_tls_with_basic_auth(
    prometheus: Callable[..., str], tls_files: TlsFiles, tmp_path: Path
) -> None:
    """`gpuwatchd sim --web.config.file`: a real Prometheus scrapes it over HTTPS with basic auth (the target is
    up); a wrong password gets 401, plain HTTP to the port gets no answer."""
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(tls_files.cert), "key_file": str(tls_files.key)},
                "basic_auth_users": {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()},
            }
        )
    )
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--gpus", "2", "--listen", f"127.0.0.1:{port}",
             "--web.config.file", str(web)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}"
        client_tls = ssl.create_default_context(cafile=str(tls_files.cert))

        async def status(path: str, user: str, password: str, scheme_url: str = url) -> int:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls)) as s,
                s.get(scheme_url + path, headers={"Authorization": f"Basic {token}"}) as r,
            ):
                return r.status

        async def serving() -> bool:
            assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{log_path.read_text()}"
            try:
                return await status("/healthz", "prometheus", "s3cret") == 200
            except aiohttp.ClientError:
                return False

        deadline = time.monotonic() + START_SECONDS
        while not await serving():
            assert time.monotonic() < deadline, "timed out waiting for gpuwatchd sim to serve over TLS"
            await asyncio.sleep(0.1)
        assert await status("/metrics", "prometheus", "wrong") == 401
        assert await status("/healthz", "nobody", "s3cret") == 401
        with pytest.raises(aiohttp.ClientError):
            await status("/metrics", "prometheus", "s3cret", f"http://127.0.0.1:{port}")

        base = prometheus(
            f"127.0.0.1:{port}",
            scheme="https",
            tls_config={"ca_file": str(tls_files.cert), "insecure_skip_verify": False},
            basic_auth={"username": "prometheus", "password": "s3cret"},
        )
        result = await asyncio.to_thread(
            wait_until, lambda: len(query(base, "gpuwatchd_gpu_memory_used_bytes")) == 2, "two GPUs over TLS", 60
        )
        assert result
        up = await asyncio.to_thread(query, base, 'up{job="gpuwatchd"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
