"""The power source (nvmlDeviceGetPowerSource) as gpuwatchd_gpu_power_supply_undersized, through the real pynvml and
the stand-in driver: undersized, AC, a board without the call, and a failing call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.exporter.gpu_families import value_families
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]


def test_an_undersized_power_supply(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [
        make_device(0, power_source=2),  # NVML_POWER_SOURCE_UNDERSIZED: an eGPU enclosure's supply too small
        make_device(1, power_source=0),  # AC
        make_device(2),  # no such reading on this board or driver: no sample, no error
        make_device(3, power_source=0, errors={"nvmlDeviceGetPowerSource": "UNKNOWN"}),
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(4, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        gpus = snap(line).gpus
        assert [g.power_supply_undersized for g in gpus] == [True, False, None, None]
        assert [g.errors for g in gpus] == [{}, {}, {}, {"power_supply_undersized": "unknown"}]
    assert lines[1]["calls"]["nvmlDeviceGetPowerSource"] == 3  # learned absent on the board without it
    family = {m.name: m for m in value_families(snap(lines[1]).gpus)}["gpuwatchd_gpu_power_supply_undersized"]
    assert [(s.labels["uuid"], s.value) for s in family.samples] == [
        (devices[0]["uuid"], 1.0),
        (devices[1]["uuid"], 0.0),
    ]
