"""The PCIe link-layer counters (field values 174-182), the per-lane errors (183, lane as scope id) and the thermal
margin (nvmlDeviceGetMarginTemperature), through the real pynvml and the stand-in driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
LINK = {"pcie_correctable_errors": 40, "pcie_non_fatal_errors": 0, "pcie_fatal_errors": 0, "pcie_naks_received": 0,
        "pcie_naks_sent": 17, "pcie_bad_tlp": 15, "pcie_bad_dllp": 3, "pcie_lcrc_errors": 21,
        "pcie_receiver_errors": 2, "pcie_unsupported_requests": 1}
EXPORTED = {"correctable": 40, "non_fatal": 0, "fatal": 0, "naks_received": 0, "naks_sent": 17, "bad_tlp": 15,
            "bad_dllp": 3, "lcrc": 21, "receiver": 2, "unsupported_request": 1}


def test_link_layer_counters_lanes_and_margin(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [
        make_device(0, field_values=LINK, pcie_lane_errors=[0, 4, 250, 0], temperature_margin=-3),
        make_device(1),  # a board without any of them (pre-R565, or a GDDR board): no reading, no error
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(2, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        a, b = snap(line).gpus
        assert a.pcie_errors_total == EXPORTED
        # lanes 4..15 answer NOT_SUPPORTED on this x4 board: only the four it has
        assert a.pcie_lane_errors_total == {"0": 0, "1": 4, "2": 250, "3": 0}
        assert a.temperature_margin_celsius == -3.0  # past its slowdown threshold: a negative margin
        assert (b.pcie_errors_total, b.pcie_lane_errors_total, b.temperature_margin_celsius) == ({}, {}, None)
        assert a.errors == b.errors == {}
    first, second = lines
    assert first["calls"]["nvmlDeviceGetMarginTemperature"] == 2
    assert second["calls"]["nvmlDeviceGetMarginTemperature"] == 1  # learned absent on the board without it


def test_a_driver_without_the_margin_call(write_sim_state: StateWriter) -> None:
    state = write_sim_state(make_state(1, devices=[make_device(0, temperature_margin=20)]))
    old = build_standin(omit=("nvmlDeviceGetMarginTemperature",))
    code, lines, err = run_worker(old, state, max_polls=2, trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert (g.temperature_margin_celsius, g.errors) == (None, {})
    assert "nvmlDeviceGetMarginTemperature" not in lines[1]["calls"]  # FUNCTION_NOT_FOUND: not looked up again


def test_a_failing_margin_call_is_that_readings_error(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = make_device(0, temperature_margin=20, errors={"nvmlDeviceGetMarginTemperature": "UNKNOWN"})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=1)
    assert code == 0, err
    g = snap(lines[0]).gpus[0]
    assert g.errors == {"temperature_margin_celsius": "unknown"} and g.temperature_celsius is not None


def test_the_flaky_cable_scenario_climbs_on_one_lane() -> None:
    scen = load_scenario("egpu-flaky-cable")
    before, during, after = (state_at(scen, t)["devices"][0] for t in (50.0, 180.0, 400.0))
    assert before["pcie_lane_errors"] == [0, 0, 0, 0] and before["field_values"]["pcie_lcrc_errors"] == 0
    lanes = during["pcie_lane_errors"]
    assert lanes[2] > 100 and lanes[1] == lanes[3] == 0
    fv = during["field_values"]
    assert fv["pcie_lcrc_errors"] > 0 and fv["pcie_bad_tlp"] > 0 and fv["pcie_naks_received"] == 0
    assert after["pcie_lane_errors"][2] == 350 and after["pcie"]["replay_counter"] == 480
