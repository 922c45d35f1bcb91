"""The gpm-training scenario as pure states: the training-step phases, every H100 with GPM, and its GPM fields'
validation (the scenario file is data, checked against the stand-in's schema at load)."""

from __future__ import annotations

import pytest

from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import ScenarioError, load_scenario, scenario_from_dict
from gpuwatchd.sim.state import encode_state


def test_a_step_goes_through_its_phases_and_repeats() -> None:
    scen = load_scenario("gpm-training")
    assert scen.gpus == 8
    phases = {0.5: "load", 2.5: "forward", 5.5: "backward", 8.5: "all_reduce", 9.5: "optimizer"}
    sm = {}
    for t, phase in phases.items():
        state = state_at(scen, t)
        encode_state(state)
        gpms = [d["gpm"] for d in state["devices"]]
        assert len(gpms) == 8 and all(g["supported"] for g in gpms)
        sm[phase] = gpms[0]["sm_util"]
        assert state_at(scen, t + 10)["devices"][0]["gpm"] == gpms[0]  # the next step is the same
    assert sm["load"] < 10 < sm["all_reduce"] < sm["optimizer"] < 60 < sm["forward"] < sm["backward"]
    load, backward = state_at(scen, 0.5)["devices"][0], state_at(scen, 5.5)["devices"][0]
    assert load["utilization"]["gpu"] > 60  # NVML's utilization hides the idle SMs
    assert load["gpm"]["pcie_rx_per_sec"] > backward["gpm"]["pcie_rx_per_sec"]
    assert backward["gpm"]["nvlink_total_tx_per_sec"] > 0 == load["gpm"]["nvlink_total_tx_per_sec"]


@pytest.mark.parametrize(("field", "value", "why"), [
    ("gpm.sm_utl", 1, "unknown field"),
    ("gpm.sm_util", "busy", "expected"),
])
def test_gpm_fields_are_checked_at_load(field: str, value: object, why: str) -> None:
    doc = {"name": "x", "description": "d", "gpus": 1, "timeline": [{"at": 0, "set": {f"devices[0].{field}": value}}]}
    with pytest.raises(ScenarioError, match=why):
        scenario_from_dict(doc)
