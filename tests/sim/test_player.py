"""The Player: writes ``state_at`` through ``write_state`` as its clock runs; the real pynvml reads it back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.runtime.clock import ManualClock, ScaledClock
from gpuwatchd.sim.player import MIN_WALL_TICK_S, Player, state_at
from gpuwatchd.sim.scenario import load_scenario, scenario_from_dict
from gpuwatchd.sim.state import RELOAD_CHECK_S, read_state, write_state

if TYPE_CHECKING:
    from conftest import Sim

T0 = 1_750_000_000.0


def without_clock(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "clock"}


def settle() -> None:
    """Let the stand-in notice a replaced state file (it checks every RELOAD_CHECK_S)."""
    time.sleep(3 * RELOAD_CHECK_S)


def test_writes_only_when_the_state_changes(tmp_path: Path) -> None:
    # No power draw, so the energy counter stands still too: nothing changes between the steps.
    scen = scenario_from_dict({"name": "s", "description": "d", "devices": {"all": {"power_usage_mw": None}},
                               "timeline": [{"at": 10, "set": {"devices[0].temperature": 77}}]})
    written: list[float] = []

    def write(path: Path, state: dict[str, Any]) -> None:
        write_state(path, state)
        written.append(state["clock"] - T0)

    clock = ManualClock(T0)
    player = Player(scen, tmp_path / "state", clock, write=write)
    player.write_initial()
    for _ in range(30):
        clock.advance(0.5)
        player.step()
    assert written == [0.0, 10.0]
    assert player.writes == 2
    on_disk = read_state(tmp_path / "state")
    assert on_disk["devices"][0]["temperature"] == 77
    assert without_clock(on_disk) == without_clock(state_at(scen, 10, start=T0))


async def test_run_follows_the_clock_until_cancelled(tmp_path: Path) -> None:
    scen = load_scenario("leak")
    clock = ManualClock(T0)
    player = Player(scen, tmp_path / "state", clock, tick=0.5)
    player.write_initial()
    task = asyncio.create_task(player.run())
    while player.scenario_time() < 30:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    on_disk = read_state(tmp_path / "state")
    t = on_disk["clock"] - T0
    assert t > 0 and t % 0.5 == pytest.approx(0) and player.writes > 10
    assert without_clock(on_disk) == without_clock(state_at(scen, t, start=T0))


async def test_speed_makes_scenario_time_run_faster_on_the_shared_clock(tmp_path: Path) -> None:
    clock = ScaledClock(start=T0, speed=1000)
    player = Player(load_scenario("leak"), tmp_path / "state", clock)
    before = player.scenario_time()
    await clock.sleep(40)  # 40 scenario seconds = 40 ms of wall time at 1000x
    assert player.scenario_time() - before >= 40
    # Scenario time and the daemon's time are the same number: one clock object.
    assert clock.now() - player.start == pytest.approx(player.scenario_time(), abs=1.0)
    state = player.write_initial()
    assert state["clock"] - player.start >= 40


def test_call_delays_are_scaled_to_wall_time() -> None:
    scen = scenario_from_dict({"name": "h", "description": "d", "timeline": [
        {"at": 5, "set": {"devices[0].delays_ms": {"*": 60000, "nvmlDeviceGetPowerUsage": -1}}}]})
    clock = ManualClock(T0)
    clock.speed = 10.0
    player = Player(scen, Path("/nonexistent/state"), clock)
    # The stand-in sleeps in real milliseconds: 60 s of scenario time at 10x is 6 s of wall time; -1 stays forever.
    assert player.state(30)["devices"][0]["delays_ms"] == {"*": 6000, "nvmlDeviceGetPowerUsage": -1}
    assert state_at(scen, 30)["devices"][0]["delays_ms"]["*"] == 60000


def test_tick_has_a_wall_floor(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    clock.speed = 1000.0
    with pytest.raises(ValueError, match="tick"):
        Player(load_scenario("idle"), tmp_path / "s", clock, tick=0)
    assert MIN_WALL_TICK_S * clock.speed > 0.5  # at 1000x, the player writes every 100 scenario seconds, not 0.5


def test_leak_through_the_standin_and_real_pynvml(sim: Sim) -> None:
    n = sim.nvml
    scen = load_scenario("leak")
    clock = ManualClock(T0)
    player = Player(scen, sim.path, clock)
    player.write_initial()
    settle()
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetName(h) == "NVIDIA RTX A5000"
    assert n.nvmlDeviceGetComputeRunningProcesses(h) == []
    readings = []
    for t in (300, 900, 1500):
        clock.advance(t - player.scenario_time())
        assert player.step()
        settle()
        expected = state_at(scen, t, start=T0)["devices"][0]
        procs = {p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
        assert procs == {4242: expected["processes"]["compute"][0]["used_memory"]}
        assert n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used == expected["memory"]["used"]
        assert n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU) == expected["temperature"]
        readings.append(procs[4242])
    assert readings == sorted(readings) and readings[0] < readings[-1]


def test_egpu_unplug_through_the_standin_and_real_pynvml(sim: Sim) -> None:
    n = sim.nvml
    scen = load_scenario("egpu-unplug")
    egpu = state_at(scen, 0)["devices"][0]["uuid"]
    clock = ManualClock(T0)
    player = Player(scen, sim.path, clock)
    clock.advance(30)
    player.write_initial()
    settle()
    n.nvmlInit()
    assert n.nvmlDeviceGetCount() == 2
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetUUID(h0) == egpu
    assert n.nvmlDeviceGetPcieThroughput(h0, n.NVML_PCIE_UTIL_RX_BYTES) > 0
    clock.advance(31)  # t=61: fell off the bus
    player.step()
    settle()
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetMemoryInfo(h0)
    assert n.nvmlDeviceGetName(h1) == "NVIDIA RTX A2000 12GB"
    clock.advance(64)  # t=125: replugged at a new bus, so a new index
    player.step()
    settle()
    n.nvmlShutdown()
    n.nvmlInit()
    uuids = [n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())]
    assert uuids[1] == egpu and len(uuids) == 2
    assert n.nvmlDeviceGetPciInfo(n.nvmlDeviceGetHandleByIndex(1)).bus == 0x71


def test_xid_event_delivered_once_through_the_standin(sim: Sim) -> None:
    n = sim.nvml
    scen = load_scenario("ecc")
    clock = ManualClock(T0)
    player = Player(scen, sim.path, clock)
    player.write_initial()
    settle()
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
    got = []
    for t in (59, 60.5, 61.5, 62, 70):
        clock.advance(t - player.scenario_time())
        player.step()
        settle()
        while True:
            try:
                got.append(n.nvmlEventSetWait(es, 0).eventData)
            except n.NVMLError_Timeout:
                break
    n.nvmlEventSetFree(es)
    assert got == [48, 63]


def test_pci_tree_follows_unplug_and_replug(tmp_path: Path) -> None:
    from gpuwatchd.sources.sysfs.pcie import nvidia_devices, read_link

    clock = ManualClock(T0)
    root = tmp_path / "sysfs"
    player = Player(load_scenario("egpu-unplug"), tmp_path / "state", clock, sysfs_root=root)
    player.write_initial()
    assert nvidia_devices(root) == {"0000:06:00.0", "0000:41:00.0"}
    link = read_link(root, "00000000:06:00.0")
    assert (link.present, link.current_generation, link.current_width) == (True, 3, 4)
    clock.advance(61)
    player.step()
    assert read_link(root, "00000000:06:00.0").present is False  # fell off the bus: dead link, still listed
    clock.advance(15)
    player.step()
    assert nvidia_devices(root) == {"0000:41:00.0"}  # removed: the directory is gone
    clock.advance(50)
    player.step()
    assert nvidia_devices(root) == {"0000:41:00.0", "0000:71:00.0"}
    assert read_link(root, "0000:71:00.0").present is True


def test_state_file_is_written_before_the_pci_tree_changes(tmp_path: Path) -> None:
    """The daemon re-enumerates when the PCI tree changes: by then the state must already list the new devices,
    or the fresh worker enumerates the old list and (the stand-in's list being fixed at init) misses the removal."""
    from gpuwatchd.sources.sysfs.pcie import nvidia_devices

    root = tmp_path / "sysfs"
    seen: list[tuple[int, set[str]]] = []  # (devices in the state being written, PCI tree at that moment)

    def write(path: Path, state: dict[str, Any]) -> None:
        seen.append((len(state["devices"]), nvidia_devices(root) if root.exists() else set()))
        write_state(path, state)

    clock = ManualClock(T0)
    player = Player(load_scenario("egpu-unplug"), tmp_path / "state", clock, sysfs_root=root, write=write)
    player.write_initial()
    for dt in (61, 15, 50):  # lost, removed, replugged
        clock.advance(dt)
        player.step()
    # The removal (2 -> 1 devices) is written while the tree still shows both; the replug while it shows one.
    assert [(n, len(tree)) for n, tree in seen] == [(2, 0), (2, 2), (1, 2), (2, 1)]
    assert nvidia_devices(root) == {"0000:41:00.0", "0000:71:00.0"}
