"""Simulated hosts for doctor: a scenario's state at time t, written as the stand-in state and fake /proc, /sys
and /dev trees under one root (what ``gpuwatchd sim`` keeps for a running simulation)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatchd.config.loader import Config
from gpuwatchd.config.types import replace
from gpuwatchd.doctor.context import Host
from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import write_state

# A daemon URL nothing listens on (port 9 is discard; refused on loopback): the daemon group is checked apart.
NO_DAEMON = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def standin() -> Path:
    from gpuwatchd.sim.build import build_standin

    return build_standin()


SimHost = Callable[..., Host]


@pytest.fixture
def sim_host(tmp_path: Path, standin: Path) -> SimHost:
    def make(name: str, t: float = 10.0, *, deadline: float = 15.0) -> Host:
        state = state_at(load_scenario(name), t)
        write_state(tmp_path / "state", state)
        mirror_sysfs(tmp_path / "root", state)
        config = replace(Config(), nvml=replace(Config().nvml, library_path=standin), state_dir=tmp_path / "state-dir")
        n = len(state["devices"])
        torch = state.get("torch") or {"installed": True, "version": "2.5.1+cu121", "cuda": "12.1",
                                        "available": n > 0, "device_count": n}  # fmt: skip
        return Host(root=tmp_path / "root", config=config, url=NO_DAEMON, deadline=deadline,
                    env={**os.environ, STATE_ENV: str(tmp_path / "state")}, torch_facts=torch)  # fmt: skip

    return make
