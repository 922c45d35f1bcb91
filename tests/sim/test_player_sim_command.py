"""``run_sim`` (what ``gpuwatchd sim`` runs): the real daemon against the stand-in, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gpuwatchd.sim.runner import EXIT_USAGE, list_scenarios, run_sim
from gpuwatchd.sim.scenario import load_scenario, scenario_names

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"


class Running:
    def __init__(self, out: io.StringIO) -> None:
        self.out = out
        self.url = ""

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}/metrics") as r:
            assert r.status == 200
            return await r.text()

    async def wait_for(self, pattern: str, what: Callable[[str], bool] | None = None) -> str:
        """Scrape until a line matches ``pattern`` (and ``what``); the test's timeout bounds the wait."""
        while True:
            body = await self.metrics()
            lines = [ln for ln in body.splitlines() if re.search(pattern, ln) and not ln.startswith("#")]
            if lines and (what is None or any(what(ln) for ln in lines)):
                return "\n".join(lines)
            await asyncio.sleep(0.2)


@asynccontextmanager
async def running(tmp_path: Path, **kw: object) -> AsyncIterator[Running]:
    out = io.StringIO()
    args: dict[str, object] = {"scenario": None, "from_xml": None, "gpus": None, "speed": 1.0,
                               "listen": "127.0.0.1:0", "config_path": None, "state_dir": tmp_path / "state"}
    args.update(kw)
    task = asyncio.create_task(run_sim(out=out, **args))  # type: ignore[arg-type]
    r = Running(out)
    while "metrics: " not in out.getvalue():
        assert not task.done(), f"run_sim ended early: {task.result()}"
        await asyncio.sleep(0.05)
    r.url = re.search(r"metrics: (\S+)/metrics", out.getvalue()).group(1)  # type: ignore[union-attr]
    try:
        yield r
    finally:
        # The user's Ctrl-C / systemd stop: run_sim installed the handler before printing its banner.
        if not task.done():
            os.kill(os.getpid(), signal.SIGTERM)
        assert await task == 0


def value(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


async def test_leak_runs_the_daemon_at_speed(tmp_path: Path) -> None:
    async with running(tmp_path, scenario="leak", speed=30.0) as sim:
        banner = sim.out.getvalue()
        assert "scenario 'leak', 1 GPU(s), 30x speed" in banner and "GpuMemoryLeak" in banner
        first = value(await sim.wait_for(r'gpu_process_memory_used_bytes\{.*pid="4242"'))
        later = await sim.wait_for(r'gpu_process_memory_used_bytes\{.*pid="4242"', lambda ln: value(ln) > first)
        assert value(later) > first
        assert value(await sim.wait_for(r"^gpuwatchd_nvml_up ")) == 1


async def test_egpu_unplug_comes_back_at_a_new_index(tmp_path: Path) -> None:
    uuid = load_scenario("egpu-unplug").devices[0]["uuid"]
    async with running(tmp_path, scenario="egpu-unplug", speed=20.0) as sim:
        first = await sim.wait_for(rf'gpuwatchd_gpu_info\{{[^}}]*uuid="{uuid}"')
        assert 'index="0"' in first and 'pci_bus_id="00000000:06:00.0"' in first
        gone = await sim.wait_for(rf'gpuwatchd_gpu_present\{{uuid="{uuid}"\}}', lambda ln: value(ln) == 0)
        assert value(gone) == 0
        back = await sim.wait_for(rf'gpuwatchd_gpu_info\{{[^}}]*uuid="{uuid}"',
                                  lambda ln: 'index="1"' in ln)
        assert 'index="1"' in back and 'pci_bus_id="00000000:71:00.0"' in back


async def test_fleet_reaches_the_daemon_with_every_process(tmp_path: Path) -> None:
    async with running(tmp_path, scenario="fleet", speed=5.0) as sim:
        counts = await sim.wait_for(r"^gpuwatchd_gpu_processes\{", lambda ln: value(ln) == 256)
        body = await sim.metrics()
        counts = "\n".join(ln for ln in body.splitlines() if ln.startswith("gpuwatchd_gpu_processes{"))
        assert [value(ln) for ln in counts.splitlines()] == [256.0] * 16
        # Per-process series are capped at the default top-N per GPU.
        assert body.count("gpuwatchd_gpu_process_memory_used_bytes{") == 16 * 10


async def test_no_driver_reports_library_not_found(tmp_path: Path) -> None:
    async with running(tmp_path, scenario="no-driver") as sim:
        assert value(await sim.wait_for(r"^gpuwatchd_nvml_up ")) == 0
        info = await sim.wait_for(r"^gpuwatchd_nvml_error_info\{")
        assert "library" in info.lower()
        assert "gpuwatchd_gpu_present{" not in await sim.metrics()


async def test_replays_a_captured_xml(tmp_path: Path) -> None:
    xml = CAPTURES / "xml04_a10g_515.105.01_gen1-x8-of-gen4-x16.xml"
    if not xml.is_file():
        pytest.skip(f"real nvidia-smi captures not available: {xml} is absent (they live outside the repo)")
    async with running(tmp_path, from_xml=xml) as sim:
        assert "capture xml04" in sim.out.getvalue()
        assert value(await sim.wait_for(r"^gpuwatchd_gpu_pcie_link_generation\{")) == 1
        assert value(await sim.wait_for(r"^gpuwatchd_gpu_pcie_link_max_width\{")) == 16


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"scenario": "idle", "from_xml": Path("x.xml")}, "exactly one of --scenario NAME or --from-xml FILE"),
        ({"scenario": None}, "exactly one of"),
        ({"scenario": "idle", "speed": 0.0}, "--speed 0: must be between 0.001 and 10000"),
        ({"scenario": "idle", "gpus": -1}, "--gpus -1: must be between 0 and 256"),
        ({"scenario": "egpu-unplug", "gpus": 1}, "needs at least 2 GPUs"),
        ({"scenario": "leek"}, "no such scenario"),
        ({"from_xml": Path("/nonexistent/capture.xml")}, "--from-xml /nonexistent/capture.xml"),
    ],
)
async def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict[str, object],
                            message: str) -> None:
    args: dict[str, object] = {"scenario": None, "from_xml": None, "gpus": None, "speed": 1.0, "listen": "127.0.0.1:0",
                               "config_path": None, "state_dir": tmp_path}
    args.update(kw)
    assert await run_sim(**args) == EXIT_USAGE  # type: ignore[arg-type]
    assert message in capsys.readouterr().err


def test_list_scenarios_says_what_to_expect() -> None:
    listed = list_scenarios()
    assert [name for name, _ in listed] == sorted(name for name, _ in listed)
    # every built-in scenario (the contract names are checked in tests/sim/test_scenarios_builtin.py)
    assert {name for name, _ in listed} == set(scenario_names())
    assert all("Expect" in description for _, description in listed)
