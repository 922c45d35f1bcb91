"""promtool check metrics is silent on the exposition of every stand-in scenario, read through the real NVML worker.

Each scenario's state at its start and at its end is written for the stand-in driver, the real worker polls it
once through the real pynvml, and both snapshots go through the store into the exposition (so GPUs that vanish
between the two, as in egpu-unplug, are exercised too). The scenario's sysfs (PCI and Thunderbolt trees, as
``gpuwatchd sim`` mirrors them) is read by the daemon's Thunderbolt source, so the dock families are on the page too:
this is every family the daemon's page carries for the scenario, with promtool's lint unfiltered.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario, scenario_names
from gpuwatchd.sources.sysfs.thunderbolt import read_docks
from gpuwatchd.store import Store
from tests.sources.workerutil import run_worker, snap

from .conftest import exposition, promtool_check, samples


def _poll(libdir: Path, state: Path, store: Store, t: float) -> None:
    code, lines, stderr = run_worker(libdir, state)
    snapshots = [line for line in lines if "nvml_ok" in line]
    assert snapshots, f"worker gave no snapshot (exit {code}): {stderr}"
    store.apply(snap({**snapshots[-1], "timestamp": t}))


@pytest.mark.parametrize("name", scenario_names())
def test_scenario_exposition_passes_promtool(
    name: str, standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path], tmp_path: Path
) -> None:
    scenario = load_scenario(name)
    # A scenario without the library (no-driver) runs the worker with a library directory that has none.
    libdir = standin_libdir if scenario.library == "present" else tmp_path / "empty"
    libdir.mkdir(exist_ok=True)
    store = Store()
    # end + 1 s: past every step, including nvml-hang's 60 s block that would otherwise stall the poll
    for t in (0.0, scenario.duration + 1.0):
        state = state_at(scenario, t)
        state_file = write_sim_state(state)
        _poll(libdir, state_file, store, 1_700_000_000.0 + t)
        mirror_sysfs(tmp_path / "root", state)
        store.set_docks(read_docks(tmp_path / "root"))
    text = exposition(store)
    result = promtool_check(text)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    if scenario.system.get("thunderbolt"):
        assert any(s.name == "gpuwatchd_thunderbolt_link_lanes" for s in samples(text)), "dock families missing"
    nvml_up = [s.value for s in samples(text) if s.name == "gpuwatchd_nvml_up"]
    # NVML is down without the library, and where the scenario makes init fail (driver-mismatch).
    down = scenario.library == "absent" or scenario.system.get("init_error") is not None
    assert nvml_up == [0.0 if down else 1.0]
