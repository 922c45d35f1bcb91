"""The simulated Thunderbolt bus: validation of the state's ``thunderbolt`` key and scenario field paths."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatchd.sim.scenario import ScenarioError, scenario_from_dict
from gpuwatchd.sim.state import encode_state, make_state
from gpuwatchd.sim.tb_tree import default_device, hide_untunnelled, validate


def _tb(**over: Any) -> dict[str, Any]:
    d = default_device()
    d.update(unique_id="u1", **over)
    return {"security": "user", "devices": [d]}


def test_the_stand_in_writer_accepts_the_thunderbolt_key() -> None:
    st = make_state(1)
    st["thunderbolt"] = _tb(gpus=[st["devices"][0]["uuid"]])
    encode_state(st)


@pytest.mark.parametrize(
    ("tb", "error"),
    [
        ({"security": "paranoid", "devices": []}, "thunderbolt.security"),
        (_tb(route="0-0"), "route 0 is the host router"),
        (_tb(route="x"), "thunderbolt.devices[0].route"),
        (_tb(colour="red"), "unknown key(s) colour"),
        (_tb(gpus="GPU-1"), "thunderbolt.devices[0].gpus"),
        ({"security": "user", "devices": [dict(default_device(), unique_id="a")] * 2}, "duplicate 0-1"),
    ],
)
def test_bad_thunderbolt_values_are_named(tb: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as e:
        validate(tb)
    assert error in str(e.value)


def test_only_gpus_behind_an_unauthorized_dock_are_hidden() -> None:
    st = make_state(2)
    st["thunderbolt"] = _tb(authorized=0, gpus=[st["devices"][1]["uuid"]])
    assert [d["uuid"] for d in hide_untunnelled(st)["devices"]] == [st["devices"][0]["uuid"]]
    st["thunderbolt"]["devices"][0]["authorized"] = 1
    assert hide_untunnelled(st) is st


def _scenario(timeline: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "t", "description": "x", "gpus": 1, "system": {"thunderbolt": _tb()}, "timeline": timeline}


def test_scenario_paths_into_the_thunderbolt_bus() -> None:
    scenario_from_dict(_scenario([{"at": 1, "set": {"thunderbolt.devices[0].rx_lanes": 1}}]))
    with pytest.raises(ScenarioError, match=r"thunderbolt\.devices\[0\]\.colour"):
        scenario_from_dict(_scenario([{"at": 1, "set": {"thunderbolt.devices[0].colour": 1}}]))
    with pytest.raises(ScenarioError, match="expected int"):
        scenario_from_dict(_scenario([{"at": 1, "set": {"thunderbolt.devices[0].rx_lanes": "two"}}]))
