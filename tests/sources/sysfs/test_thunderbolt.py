"""The Thunderbolt source against fake sysfs trees laid out as the kernel does (built by ``sim/pci_tree.py``)."""

from __future__ import annotations

import asyncio
import copy
import os
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.config.loader import Config, SysfsConfig
from gpuwatchd.config.types import replace
from gpuwatchd.model import DockSample
from gpuwatchd.runtime.beat import Beat
from gpuwatchd.runtime.clock import RealClock
from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.state import make_state
from gpuwatchd.sim.tb_tree import default_device
from gpuwatchd.sources.sysfs import thunderbolt
from gpuwatchd.sources.sysfs.thunderbolt import ResolvedLinks, domain_security, parse_speed, read_docks, watch_docks


def _dock(route: str, uid: str, gpus: list[str], **over: Any) -> dict[str, Any]:
    d = default_device(route)
    d.update(unique_id=uid, gpus=gpus, **over)
    return d


def _state(docks: list[dict[str, Any]], n: int = 2, security: str = "user") -> dict[str, Any]:
    st = make_state(n)
    st["thunderbolt"] = {"security": security, "devices": docks}
    return st


def test_speed_is_per_lane_in_bits() -> None:
    assert parse_speed("20.0 Gb/s") == 20e9
    assert parse_speed("10 Gb/s") == 10e9
    assert parse_speed("fast") is None
    assert parse_speed(None) is None
    assert parse_speed("\u0662\u0660 Gb/s") is None  # Arabic-Indic digits
    assert parse_speed("9" * 4000 + " Gb/s") is None  # read as a float, +Inf


def test_no_thunderbolt_bus_means_no_docks(tmp_path: Path) -> None:
    assert read_docks(tmp_path) == ()
    assert domain_security(tmp_path) == {}


def test_dock_is_tied_to_the_gpu_behind_it_and_not_to_the_internal_one(tmp_path: Path) -> None:
    st = _state([_dock("0-1", "uid-1", [])])
    egpu = st["devices"][0]["uuid"]
    st["thunderbolt"]["devices"][0]["gpus"] = [egpu]
    mirror_sysfs(tmp_path, st)
    (d,) = read_docks(tmp_path)
    assert d == DockSample(
        unique_id="uid-1", route="0-1", domain="domain0", security="user", authorized=True, vendor="Razer",
        name="Core X", generation=3, rx_speed_bps=20e9, tx_speed_bps=20e9, rx_lanes=2, tx_lanes=2,
        gpu_bus_ids=("0000:0c:00.0",),
    )
    assert domain_security(tmp_path) == {"domain0": "user"}


def test_unauthorized_dock_holds_no_gpu(tmp_path: Path) -> None:
    mirror_sysfs(tmp_path, _state([_dock("0-1", "uid-1", [], authorized=0)], n=1))
    (d,) = read_docks(tmp_path)
    assert (d.authorized, d.gpu_bus_ids) == (False, ())


def test_a_daisy_chain_is_left_untied_rather_than_guessed(tmp_path: Path) -> None:
    st = _state([_dock("0-1", "hub", []), _dock("0-301", "enclosure", [])])
    st["thunderbolt"]["devices"][1]["gpus"] = [st["devices"][0]["uuid"]]
    mirror_sysfs(tmp_path, st)
    assert [(d.unique_id, d.gpu_bus_ids) for d in read_docks(tmp_path)] == [("hub", ()), ("enclosure", ())]


def test_garbage_attributes_read_as_unknown(tmp_path: Path) -> None:
    mirror_sysfs(tmp_path, _state([_dock("0-1", "uid-1", [])], n=1))
    d = tmp_path / "sys/bus/thunderbolt/devices/0-1"
    (d / "rx_speed").write_text("Unknown\n")
    (d / "rx_lanes").write_text("two\n")
    (d / "generation").unlink()
    (dock,) = read_docks(tmp_path)
    assert (dock.rx_speed_bps, dock.rx_lanes, dock.generation) == (None, None, None)


def test_detach_and_replug_at_another_bus(tmp_path: Path) -> None:
    st = _state([_dock("0-1", "uid-1", [])], n=1)
    st["thunderbolt"]["devices"][0]["gpus"] = [st["devices"][0]["uuid"]]
    mirror_sysfs(tmp_path, st)
    assert read_docks(tmp_path)[0].gpu_bus_ids == ("0000:0c:00.0",)
    gone = dict(st, devices=[], thunderbolt={"security": "user", "devices": []})
    mirror_sysfs(tmp_path, gone)
    assert read_docks(tmp_path) == ()
    assert not list((tmp_path / "sys/bus/pci/devices").iterdir())
    st["devices"][0]["pci"]["bus"] = 0x71
    mirror_sysfs(tmp_path, st)
    assert read_docks(tmp_path)[0].gpu_bus_ids == ("0000:71:00.0",)


async def test_watch_reports_the_docks_every_interval(tmp_path: Path) -> None:
    mirror_sysfs(tmp_path, _state([_dock("0-1", "uid-1", [])], n=1))
    cfg = replace(Config(), sysfs=SysfsConfig(root=tmp_path))
    seen: list[tuple[DockSample, ...]] = []
    task = asyncio.create_task(watch_docks(lambda: cfg, RealClock(), seen.append))

    async def two() -> None:
        while len(seen) < 2:
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(two(), 30)
    finally:
        task.cancel()
    assert [d.unique_id for d in seen[-1]] == ["uid-1"]


async def test_watch_reads_on_the_beat_of_the_nvml_lines(tmp_path: Path) -> None:
    """With the supervisor's beat, a read follows each worker line (in its wake-up) instead of a timer of its own:
    with a two-minute poll interval, only the beat can bring the second read within the test."""
    mirror_sysfs(tmp_path, _state([_dock("0-1", "uid-1", [])], n=1))
    cfg = replace(Config(), sysfs=SysfsConfig(root=tmp_path), nvml=replace(Config().nvml, poll_interval=120.0))
    seen: list[tuple[DockSample, ...]] = []
    beat = Beat()
    task = asyncio.create_task(watch_docks(lambda: cfg, RealClock(), seen.append, beat=beat))

    async def reads(n: int) -> None:
        while len(seen) < n:
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(reads(1), 30)  # at start, as always
        for n in (2, 3):
            beat.fire()
            await asyncio.wait_for(reads(n), 30)
    finally:
        task.cancel()
    assert len(seen) == 3 and [d.unique_id for d in seen[-1]] == ["uid-1"]


def test_kept_links_give_the_same_docks_through_a_detach_and_a_replug_elsewhere(tmp_path: Path) -> None:
    """The watch's ResolvedLinks: the docks read with it are those read without, each time, while the GPU is
    detached and plugged back at another bus behind the dock (its bus entry then links elsewhere)."""
    links = ResolvedLinks()
    st = _state([_dock("0-1", "uid-1", [])], n=1)
    st["thunderbolt"]["devices"][0]["gpus"] = [st["devices"][0]["uuid"]]
    gone = dict(st, devices=[], thunderbolt={"security": "user", "devices": []})
    moved = copy.deepcopy(st)
    moved["devices"][0]["pci"]["bus"] = 0x71
    for state, behind in ((st, ("0000:0c:00.0",)), (st, ("0000:0c:00.0",)), (gone, None), (moved, ("0000:71:00.0",)),
                          (moved, ("0000:71:00.0",))):
        mirror_sysfs(tmp_path, state)
        kept = read_docks(tmp_path, links=links)
        assert kept == read_docks(tmp_path)
        assert (kept[0].gpu_bus_ids if kept else None) == behind


def test_resolved_links_read_one_link_when_nothing_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:05:00.0"
    real.mkdir(parents=True)
    (tmp_path / "bus").mkdir()
    entry = tmp_path / "bus/0000:05:00.0"
    entry.symlink_to("../devices/pci0000:00/0000:00:01.0/0000:05:00.0")
    links = ResolvedLinks()
    assert links.realpath(entry) == os.path.realpath(entry)
    calls: list[str] = []
    real_realpath = thunderbolt.os.path.realpath

    def counted(p: Any) -> str:
        calls.append(os.fspath(p))
        return real_realpath(p)

    monkeypatch.setattr(thunderbolt.os.path, "realpath", counted)
    assert links.realpath(entry) == real_realpath(entry) and calls == []  # kept: one readlink
    other = tmp_path / "devices/pci0000:00/0000:00:02.0/0000:05:00.0"
    other.mkdir(parents=True)
    entry.unlink()
    entry.symlink_to("../devices/pci0000:00/0000:00:02.0/0000:05:00.0")  # the device came back elsewhere
    assert links.realpath(entry) == real_realpath(other) and len(calls) == 1
    assert links.realpath(real) == real_realpath(real) and len(calls) == 2  # not a link: resolved every time
    assert links.realpath(real) == real_realpath(real) and len(calls) == 3
