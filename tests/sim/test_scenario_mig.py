"""MIG device fields in scenarios (sim/scenario_mig.py): timeline paths into mig_devices, and their memory."""

from __future__ import annotations

import pytest

from gpuwatchd.sim.scenario import ScenarioError, scenario_from_dict
from gpuwatchd.sim.scenario_fields import check_field, device_schema, parse_path
from gpuwatchd.sim.scenario_mig import derive_mig_memory

MIB = 1 << 20


@pytest.mark.parametrize(("path", "value"), [
    ("devices[0].mig_devices[2].processes.compute[pid=4303].used_memory", "2GiB"),
    ("devices[0].mig_devices[0].memory.total", 9856 * MIB),
    ("devices[0].mig_devices[1].errors.nvmlDeviceGetMemoryInfo_v2", "UNKNOWN"),
    ("devices[0].mig_devices[1].profile", "1g.10gb"),
    ("devices[0].mig_devices", []),
    ("devices[0].mig_max_devices", 7),
])
def test_paths_into_mig_devices(path: str, value: object) -> None:
    check_field(parse_path(path), value, device_schema())


@pytest.mark.parametrize(("path", "value", "message"), [
    ("devices[0].mig_devices[0].memroy.used", 1, "unknown field"),
    ("devices[0].mig_devices[0].profile", 7, "expected str"),
    ("devices[0].mig_devices[0].processes.computer", [], "unknown field"),
])
def test_bad_mig_paths_are_named(path: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_field(parse_path(path), value, device_schema())


def test_a_scenario_with_a_typo_in_a_mig_path_does_not_load() -> None:
    doc = {"name": "x", "description": "Expect nothing.", "gpus": 1,
           "timeline": [{"at": 1, "set": {"devices[0].mig_devices[0].memroy.used": 1}}]}
    with pytest.raises(ScenarioError, match=r"unknown field 'devices\[0\]\.mig_devices\[0\]\.memroy\.used'"):
        scenario_from_dict(doc, "x.yml")


def test_memory_of_mig_devices_and_their_gpu() -> None:
    dev = {"_other_used": 100 * MIB, "mig_devices": [
        {"memory": {"total": 1000 * MIB, "reserved": 0, "used": 12 * MIB},
         "processes": {"compute": [{"pid": 1, "used_memory": 500 * MIB}, {"pid": 2, "used_memory": None}]}},
        {"memory": {"total": 1000 * MIB, "reserved": 10 * MIB, "used": 12 * MIB},
         "processes": {"compute": [{"pid": 3, "used_memory": 5000 * MIB}]}},  # more than fits: capped
    ]}
    derive_mig_memory(dev)
    assert [m["memory"]["used"] for m in dev["mig_devices"]] == [512 * MIB, 990 * MIB]
    assert dev["_other_used"] == (100 + 512 + 990) * MIB
