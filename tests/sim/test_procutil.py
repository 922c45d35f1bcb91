"""Scenario per-process utilization fields become the stand-in's timestamped samples (sim/procutil.py)."""

from __future__ import annotations

from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import scenario_from_dict
from gpuwatchd.sim.state import encode_state

T0 = 1_700_000_000.0


def _scenario() -> dict[str, object]:
    return {"name": "s", "description": "d", "gpus": 2, "timeline": [
        {"at": 0, "add_process": {"gpu": 0, "pid": 4242, "used_memory": "1GiB", "sm_util": 80, "memory_util": 30}},
        {"at": 0, "add_process": {"gpu": 0, "pid": 4343, "used_memory": "1GiB", "sm_util": 0}},
        {"at": 0, "add_process": {"gpu": 1, "pid": 5000, "used_memory": "1GiB"}},
        {"at": 5, "ramp": {"path": "devices[0].processes.compute[pid=4242].sm_util", "from": 80, "to": 0,
                           "over": 10}},
    ]}


def test_samples_are_stamped_with_the_state_clock() -> None:
    scen = scenario_from_dict(_scenario())
    s = state_at(scen, 2, start=T0)
    gpu0, gpu1 = s["devices"]
    assert gpu0["process_utilization"] == [
        {"pid": 4242, "timestamp_us": int((T0 + 2) * 1e6), "sm": 80, "memory": 30}]  # 4343: idle, no sample
    assert all("sm_util" not in p for p in gpu0["processes"]["compute"])  # NVML has no such process field
    assert "process_utilization" not in gpu1  # no process with the fields: NOT_SUPPORTED as before
    encode_state(s)  # a valid stand-in state
    later = state_at(scen, 10, start=T0)["devices"][0]["process_utilization"]
    assert [(x["sm"], x["timestamp_us"]) for x in later] == [(40, int((T0 + 10) * 1e6))]
    assert [(x["sm"], x["memory"]) for x in state_at(scen, 20, start=T0)["devices"][0]["process_utilization"]] == [
        (0, 30)]
