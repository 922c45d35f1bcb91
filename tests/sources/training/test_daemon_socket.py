"""The whole path for real: a client process running gpuwatchd.training (allocator output replayed at its one seam),
the stand-in driver listing that process on a GPU, the daemon's socket, the store and /metrics; and peers that
must be refused and counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.config.loader import config_from_dict
from gpuwatchd.daemon import Daemon
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state
from tests.until import until

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "training" / "minkowski-359-a.json"
CLIENT = """
import json, sys, time, types
sys.modules["torch"] = types.ModuleType("torch")  # the reporter reads torch from sys.modules; the seam replaces it
import gpuwatchd.training as t
from gpuwatchd.training import stats
recorded = json.load(open(sys.argv[1]))
recorded["allocated_bytes.all.current"] = 40 << 20  # the MinkowskiEngine dump shows no allocated bytes
stats.read_devices = lambda torch: [stats.RawDevice(0, sys.argv[2], recorded, 1 << 30, 16 << 30)]
t.watch(interval=0.2)
for _ in t.wrap_input(iter(lambda: time.sleep(0.05), 1)):
    time.sleep(0.05)
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gw-t-"))  # short: a unix socket path has 107 bytes at most
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def client(tmp_path: Path, sock_dir: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(uuid: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCHD_TRAINING_SOCKET": str(sock_dir / "training.sock")}
        p = subprocess.Popen([sys.executable, "-c", CLIENT, str(FIXTURE), uuid], env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
async def daemon(tmp_path: Path, standin_libdir: Path, sock_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Daemon] = []

    async def start(state: Path, **training: Any) -> Daemon:
        cfg: dict[str, Any] = {"listen": "127.0.0.1:0", "state_dir": str(tmp_path / "state"),
               "nvml": {"library_path": str(standin_libdir), "poll_interval": "200ms"},
               "sysfs": {"root": str(tmp_path / "sysfs")}, "probes": {"enabled": False},
               "training": {"socket": str(sock_dir / "training.sock"), "min_interval": "100ms", **training}}
        d = Daemon(config_from_dict(cfg), worker_env={STATE_ENV: str(state)})
        await d.start()
        made.append(d)
        return d

    yield start
    for d in made:
        await d.stop()


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    return next((v for (n, lab), v in samples.items() if n == name and want <= set(lab)), None)


async def test_a_training_process_on_a_gpu_reports_its_allocator(
    daemon: Callable[..., Any], client: Callable[[str], subprocess.Popen[bytes]],
    write_sim_state: Callable[[dict[str, Any]], Path],
) -> None:
    state = make_state(2)
    uuid = state["devices"][0]["uuid"]
    proc = client(uuid)
    state["devices"][0]["processes"] = {"compute": [{"pid": proc.pid, "used_memory": 100 << 20}], "graphics": []}
    d = await daemon(write_sim_state(state))
    pid = str(proc.pid)

    async def reported() -> Samples | None:
        s = await scrape(d.url)
        return s if value(s, "gpuwatchd_process_torch_input_wait_ratio", pid=pid) is not None else None

    s = await until_async(reported, "the client's allocator on /metrics")
    assert value(s, "gpuwatchd_process_torch_allocated_bytes", uuid=uuid, pid=pid) == 40 << 20
    assert value(s, "gpuwatchd_process_torch_reserved_bytes", uuid=uuid, pid=pid) == 50331648
    assert value(s, "gpuwatchd_process_torch_inactive_split_bytes", uuid=uuid, pid=pid) == 7514112
    assert value(s, "gpuwatchd_process_torch_alloc_retries_total", uuid=uuid, pid=pid) == 2
    assert value(s, "gpuwatchd_process_torch_ooms_total", uuid=uuid, pid=pid) == 0
    assert 0.0 < (value(s, "gpuwatchd_process_torch_input_wait_ratio", pid=pid) or 0) <= 1.0
    assert value(s, "gpuwatchd_training_socket_up") == 1
    assert value(s, "gpuwatchd_training_peers") == 1
    assert (value(s, "gpuwatchd_training_messages_total", result="accepted") or 0) >= 1
    # the process leaves the GPU: its allocator series go with it
    proc.kill()
    proc.wait()
    state["devices"][0]["processes"] = {"compute": [], "graphics": []}
    write_sim_state(state)

    async def gone() -> bool:
        s = await scrape(d.url)
        return value(s, "gpuwatchd_process_torch_allocated_bytes", pid=pid) is None
    await until_async(gone, "the series of the process that left")
    assert not d.store.training.reports


async def test_hostile_peers_are_refused_and_counted(
    daemon: Callable[..., Any], write_sim_state: Callable[[dict[str, Any]], Path], sock_dir: Path,
) -> None:
    d = await daemon(write_sim_state(make_state(1)))
    path = str(sock_dir / "training.sock")
    await until(lambda: d.store.training.status is not None and d.store.training.status.up, "the socket")
    loop = asyncio.get_running_loop()

    def talk(data: bytes) -> bytes:
        """Send ``data`` and read until the daemon closes (the refusal line)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(path)
            with contextlib.suppress(OSError):  # closed on us mid-send (the oversized line): what we want
                s.sendall(data)
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            return out

    valid = json.dumps({"v": 1, "pid": os.getpid(), "devices": [{"index": 0, "allocated_bytes": 1}]}).encode()
    cases = {
        "malformed": b"{not json\n",
        "unsupported_version": b'{"v": 99, "devices": []}\n',
        "oversized": b"x" * (70 * 1024) + b"\n",
    }
    for result, data in cases.items():
        reply = await loop.run_in_executor(None, talk, data)
        assert json.loads(reply.splitlines()[0])["error"], result
    # this test's own process holds no GPU context: lines refused, the connection kept a while, then dropped
    flood = await loop.run_in_executor(None, talk, (valid + b"\n") * 40)
    assert b"more than one line per" in flood
    s = await scrape(d.url)
    for result in (*cases, "no_gpu_context", "rate_limited"):
        assert (value(s, "gpuwatchd_training_messages_total", result=result) or 0) >= 1, result
    assert value(s, "gpuwatchd_training_messages_total", result="accepted") == 0
    assert not d.store.training.reports  # nothing from a process without a GPU context
    await until(lambda: d.store.training.status is not None and d.store.training.status.peers == 0, "peers gone")


async def test_disabled_there_is_no_socket_and_nothing_else_changes(
    daemon: Callable[..., Any], write_sim_state: Callable[[dict[str, Any]], Path], sock_dir: Path,
) -> None:
    d = await daemon(write_sim_state(make_state(1)), enabled=False)
    s = await until_async(lambda: scrape_when_up(d.url), "the first poll")
    assert d.training is None and not (sock_dir / "training.sock").exists()
    assert not [n for (n, _) in s if n.startswith(("gpuwatchd_training_", "gpuwatchd_process_torch_"))]


async def scrape_when_up(url: str) -> Samples | None:
    s = await scrape(url)
    return s if value(s, "gpuwatchd_nvml_up") == 1 else None


async def until_async(cond: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    end = asyncio.get_running_loop().time() + timeout
    while not (r := await cond()):
        assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return r
