"""Every built-in scenario, sampled with the pure ``state_at``: the shapes the issue asks for, at several times."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuwatchd.sim.player import PID_MAX, state_at
from gpuwatchd.sim.scenario import Scenario, load_scenario, scenario_from_dict, scenario_names
from gpuwatchd.sim.state import encode_state

MIB = 2**20
CONTRACT_NAMES = {"idle", "leak", "plateau", "throttle-thermal", "power-brake", "sw-power-cap-idle", "egpu-unplug",
                  "xid-storm", "ecc", "link-degraded", "nvml-hang", "no-driver", "fleet", "dock-unauthorized",
                  "tb-link-degraded", "driver-mismatch", "cuda-too-old", "probe-sdc", "egpu-slow-link", "probe-hang",
                  "mig", "gpm-training"}
CONTRACT_NAMES |= {"underutilized"}  # issue 10
CONTRACT_NAMES |= {"nvlink-errors", "recovery-action"}  # issue 10
CONTRACT_NAMES |= {"hgx-8gpu", "fabric-gpu-unregistered", "nvlink-down"}  # issue 32
CONTRACT_NAMES |= {"egpu-flaky-cable"}  # issue 16
CONTRACT_NAMES |= {"attribution"}  # issue 19
CONTRACT_NAMES |= {"xid-repeat"}  # issue 22
CONTRACT_NAMES |= {"dead-process-memory"}  # issue 22
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80


def proc(state: dict[str, Any], dev: int, pid: int) -> dict[str, Any] | None:
    for p in state["devices"][dev]["processes"]["compute"]:
        if p["pid"] == pid:
            return p
    return None


def test_the_contract_scenarios_are_all_there() -> None:
    assert set(scenario_names()) == CONTRACT_NAMES


@pytest.mark.parametrize("name", sorted(CONTRACT_NAMES))
def test_scenario_is_valid_at_many_times(name: str) -> None:
    scen = load_scenario(name)
    assert scen.name == name
    # Each description tells the user what they will see.
    assert "Expect" in scen.description
    for t in (0, 4.9, 5, 30, 61, 76, 121, 333, 1799, 3600):
        state = state_at(scen, t)
        encode_state(state)  # the stand-in's own validation accepts it
        uuids = [d["uuid"] for d in state["devices"]]
        assert len(set(uuids)) == len(uuids)
        for dev in state["devices"]:
            mem = dev["memory"]
            assert 0 <= mem["used"] <= mem["total"] - mem["reserved"]
        assert state["clock"] == pytest.approx(1_700_000_000.0 + t)


def test_state_at_is_pure() -> None:
    scen = load_scenario("fleet")
    assert state_at(scen, 95.5) == state_at(scen, 95.5)


def test_leak_grows_steadily_to_nearly_full() -> None:
    scen = load_scenario("leak")
    assert proc(state_at(scen, 9), 0, 4242) is None
    samples = [(t, state_at(scen, t)) for t in range(10, 2000, 30)]
    used = [proc(s, 0, 4242)["used_memory"] for _, s in samples]  # type: ignore[index]
    assert all(b >= a for a, b in itertools.pairwise(used))
    assert used[-1] > used[0]
    grown = proc(state_at(scen, 1000), 0, 4242)["used_memory"] - proc(state_at(scen, 400), 0, 4242)["used_memory"]  # type: ignore[index]
    rate_mb_s = grown / 600 / 1e6
    assert 5 < rate_mb_s < 50  # "tens of MB/s-ish"
    half_hour = state_at(scen, 1810)["devices"][0]["memory"]
    assert half_hour["used"] / half_hour["total"] > 0.9
    assert state_at(scen, 600)["devices"][0]["memory"]["used"] / half_hour["total"] < 0.5
    # The device's used memory is the process plus what no listed process owns; nothing vanishes.
    st = state_at(scen, 700)
    assert st["devices"][0]["memory"]["used"] == proc(st, 0, 4242)["used_memory"] + 250 * MIB  # type: ignore[index]


def test_plateau_flattens_with_spikes_that_come_back() -> None:
    scen = load_scenario("plateau")

    def mem(t: float) -> int:
        return proc(state_at(scen, t), 0, 31337)["used_memory"]  # type: ignore[index]

    warmup = [mem(t) for t in range(5, 126, 10)]
    assert all(b >= a for a, b in itertools.pairwise(warmup))
    # Saturating: the first half of the warm-up grows more than the second.
    assert mem(65) - mem(5) > mem(125) - mem(65)
    peak = 17500 * MIB
    series = [mem(t) for t in range(130, 3600, 5)]
    assert min(series) == peak
    assert max(series) == peak + 1536 * MIB
    spikes = [i for i, v in enumerate(series) if v > peak]
    assert spikes, "evaluation spikes must appear"
    assert series[-1] == peak or series[spikes[-1] + 1] == peak  # each spike comes back down
    # Flat on average: the second half of the hour is no higher than the first.
    half = len(series) // 2
    assert sum(series[half:]) / len(series[half:]) <= sum(series[:half]) / half + 0.05 * peak


def test_egpu_unplug_phases_and_same_uuid_at_new_index() -> None:
    scen = load_scenario("egpu-unplug")
    egpu, internal = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30", "GPU-7d52c1a0-41a2-4c35-9a4f-0a2000a20000"
    before = state_at(scen, 30)["devices"]
    assert [d["uuid"] for d in before] == [egpu, internal]
    assert before[0]["pcie"]["width"] == 4 and not before[0]["lost"]
    lost = state_at(scen, 61)["devices"]
    assert lost[0]["uuid"] == egpu and lost[0]["lost"] is True
    assert [e["data"] for e in state_at(scen, 61)["events"] if e["uuid"] == egpu] == [79]
    removed = state_at(scen, 80)["devices"]
    assert [d["uuid"] for d in removed] == [internal]
    back = state_at(scen, 125)["devices"]
    assert [d["uuid"] for d in back] == [internal, egpu]
    assert back[1]["lost"] is False and back[1]["pci"]["bus"] == 0x71


def collect_events(scen: Scenario, until: float, step: float = 0.5) -> dict[int, tuple[float, dict[str, Any]]]:
    """seq -> (first time seen, event), checking an event never changes once queued."""
    seen: dict[int, tuple[float, dict[str, Any]]] = {}
    for i in range(int(until / step) + 1):
        t = i * step
        for ev in state_at(scen, t)["events"]:
            if ev["seq"] in seen:
                assert seen[ev["seq"]][1] == ev
            else:
                seen[ev["seq"]] = (t, ev)
    return seen


def test_xid_storm_events_appear_once_with_increasing_seq() -> None:
    scen = load_scenario("xid-storm")
    seen = collect_events(scen, 200)
    by_seq = [seen[s] for s in sorted(seen)]
    assert [t for t, _ in by_seq] == sorted(t for t, _ in by_seq)
    xids = [ev["data"] for _, ev in by_seq if ev["type"] == "xid"]
    assert xids == [13, 13, 13, 31, 31, 31, 48, 79]
    assert {ev["type"] for _, ev in by_seq} == {"xid", "dbe"}
    gpu1 = state_at(scen, 0)["devices"][1]["uuid"]
    assert {ev["uuid"] for _, ev in by_seq if ev["data"] in (48, 79)} == {gpu1}
    # An event is queued at its time, not before; and long after, the queue is empty again.
    assert all(t >= 15 for t, _ in by_seq)
    assert state_at(scen, 1000)["events"] == []
    late = state_at(scen, 95)["devices"]
    assert late[1]["lost"] is True and late[1]["ecc_errors"]["uncorrected_volatile"] == 1
    assert late[0]["lost"] is False


def test_looping_keeps_seq_increasing_across_cycles() -> None:
    scen = scenario_from_dict({"name": "l", "description": "d", "loop": True, "duration": 10,
                               "timeline": [{"at": 1, "xid": {"gpu": 0, "code": 31}}]})
    seen = collect_events(scen, 35)
    assert [(round(t, 1), ev["seq"]) for t, ev in sorted(seen.values(), key=lambda x: x[0])] == [
        (1.0, 1), (11.0, 2), (21.0, 3), (31.0, 4)]


def test_nvml_hang_blocks_gpu1_from_5s_to_65s() -> None:
    scen = load_scenario("nvml-hang")
    for t, expected in ((4.9, {}), (5, {"*": 60000}), (40, {"*": 60000}), (64.9, {"*": 60000}), (65, {}), (300, {})):
        devs = state_at(scen, t)["devices"]
        assert devs[1].get("delays_ms", {}) == expected, t
        assert devs[0].get("delays_ms", {}) == {}


def test_fleet_has_16_x_256_with_stable_unique_pids_and_mild_churn() -> None:
    scen = load_scenario("fleet")

    def pids(t: float) -> list[set[int]]:
        return [{p["pid"] for p in d["processes"]["compute"]} for d in state_at(scen, t)["devices"]]

    at31 = pids(31)
    assert len(at31) == 16 and all(len(s) == 256 for s in at31)
    everyone = set().union(*at31)
    assert len(everyone) == 16 * 256
    assert all(1 < pid < PID_MAX for pid in everyone)
    assert pids(59) == at31  # stable between churn ticks
    churned = [len(a - b) for a, b in zip(pids(0), at31, strict=True)]
    assert churned == [2] * 16
    later = pids(600)
    assert all(0 < len(a - b) <= 40 for a, b in zip(pids(0), later, strict=True))
    assert len(set().union(*later)) == 16 * 256
    # A replaced pid never comes back while the fleet runs.
    assert not (set().union(*pids(0)) - set().union(*later)) & set().union(*pids(1200))


def test_throttle_thermal_cycle() -> None:
    scen = load_scenario("throttle-thermal")
    dev = lambda t: state_at(scen, t)["devices"][0]  # noqa: E731
    assert dev(30)["clocks_event_reasons"] == 0
    assert dev(200)["clocks_event_reasons"] & SW_THERMAL and not dev(200)["clocks_event_reasons"] & HW_THERMAL
    hot = dev(300)
    assert hot["clocks_event_reasons"] & HW_THERMAL and hot["clocks_event_reasons"] & HW_SLOWDOWN
    assert hot["temperature"] >= 90 and hot["clocks_mhz"]["graphics"] < dev(30)["clocks_mhz"]["graphics"] / 2
    assert hot["violation_ns"]["thermal"] > dev(200)["violation_ns"]["thermal"] > 0
    assert dev(550)["clocks_event_reasons"] == 0
    assert {**dev(800), "energy_mj": 0} == {**dev(200), "energy_mj": 0}  # loops every 600 s


def test_power_brake_is_power_not_heat() -> None:
    scen = load_scenario("power-brake")
    braked = state_at(scen, 120)["devices"][0]
    assert braked["clocks_event_reasons"] == HW_SLOWDOWN | HW_POWER_BRAKE
    assert braked["power_usage_mw"] < 150_000 and braked["temperature"] < 80 and braked["utilization"]["gpu"] == 100
    assert state_at(scen, 250)["devices"][0]["clocks_event_reasons"] == 0
    assert state_at(scen, 420)["devices"][0]["clocks_event_reasons"] == HW_SLOWDOWN | HW_POWER_BRAKE


def test_sw_power_cap_idle_is_idle() -> None:
    scen = load_scenario("sw-power-cap-idle")
    for t in (0, 100, 1000):
        dev = state_at(scen, t)["devices"][0]
        assert dev["clocks_event_reasons"] == SW_POWER_CAP
        assert dev["pstate"] == 8 and dev["utilization"]["gpu"] == 0
        assert dev["power_usage_mw"] < 0.2 * dev["power_limit_mw"]


def test_link_degraded_only_under_load() -> None:
    scen = load_scenario("link-degraded")
    idle = state_at(scen, 10)["devices"][0]
    assert (idle["pcie"]["gen"], idle["pcie"]["width"], idle["utilization"]["gpu"]) == (1, 16, 0)
    loaded = state_at(scen, 60)["devices"][0]
    assert (loaded["pcie"]["gen"], loaded["pcie"]["max_gen"], loaded["pcie"]["width"], loaded["pcie"]["max_width"]) == (
        1, 4, 4, 16)
    assert loaded["utilization"]["gpu"] >= 90
    assert state_at(scen, 300)["devices"][0]["pcie"]["replay_counter"] > loaded["pcie"]["replay_counter"] > 0


def test_ecc_dbe_and_remap_pending() -> None:
    scen = load_scenario("ecc")
    clean = state_at(scen, 30)["devices"][0]
    assert clean["ecc_errors"]["uncorrected_volatile"] == 0 and not clean["remapped_rows"]["pending"]
    hit = state_at(scen, 70)
    dev = hit["devices"][0]
    assert dev["ecc_errors"]["uncorrected_volatile"] == 1 and dev["ecc_errors"]["uncorrected_aggregate"] == 1
    assert dev["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}
    assert [(e["type"], e["data"]) for e in hit["events"]] == [("xid", 48), ("dbe", 0), ("xid", 63)]


def test_no_driver_means_no_library() -> None:
    scen = load_scenario("no-driver")
    assert scen.library == "absent"
    assert state_at(scen, 10)["devices"] == []


def test_idle_takes_any_gpu_count() -> None:
    scen = load_scenario("idle").with_gpus(5)
    devs = state_at(scen, 50)["devices"]
    assert len(devs) == 5 and len({d["uuid"] for d in devs}) == 5
    assert all(d["clocks_event_reasons"] == 0x1 and d["pstate"] == 8 for d in devs)


def test_energy_counter_integrates_power() -> None:
    scen = load_scenario("leak")
    e = [state_at(scen, t)["devices"][0]["energy_mj"] for t in (0, 10, 610, 1210)]
    assert e == sorted(e)
    # 600 s around a ~118 W mean (wave) -> ~70.8 kJ; the wave's whole periods cancel out.
    assert (e[2] - e[1]) / 1000 == pytest.approx(118 * 600, rel=0.03)
    assert (e[1] - e[0]) / 1000 == pytest.approx(28 * 10, rel=0.01)
    looped = load_scenario("power-brake")
    cycle = state_at(looped, 300)["devices"][0]["energy_mj"] - state_at(looped, 0)["devices"][0]["energy_mj"]
    two = state_at(looped, 600)["devices"][0]["energy_mj"] - state_at(looped, 0)["devices"][0]["energy_mj"]
    assert two == pytest.approx(2 * cycle, rel=1e-6)
    assert cycle / 1000 == pytest.approx(342 * 180 + 112 * 120, rel=0.01)


def test_dock_unauthorized_hides_the_gpu_until_the_dock_is_authorized() -> None:
    scen = load_scenario("dock-unauthorized")
    before, after = state_at(scen, 89), state_at(scen, 91)
    assert before["devices"] == [] and before["thunderbolt"]["devices"][0]["authorized"] == 0
    assert [d["name"] for d in after["devices"]] == ["NVIDIA GeForce RTX 4070"]
    assert after["thunderbolt"]["devices"][0]["authorized"] == 1


def test_tb_link_degraded_trains_one_slow_lane_under_load() -> None:
    state = state_at(load_scenario("tb-link-degraded"), 60)
    (dock,) = state["thunderbolt"]["devices"]
    assert (dock["rx_lanes"], dock["tx_lanes"], dock["rx_speed"], dock["tx_speed"]) == (1, 1, 10, 10)
    assert state["devices"][0]["utilization"]["gpu"] == 97


def test_egpu_unplug_detaches_the_enclosure_with_the_gpu() -> None:
    scen = load_scenario("egpu-unplug")
    egpu = state_at(scen, 0)["devices"][0]["uuid"]
    # the cable is pulled at 58 s: the enclosure leaves the Thunderbolt bus with the kernel's lines (issue 17)
    assert [d["gpus"] for d in state_at(scen, 57)["thunderbolt"]["devices"]] == [[egpu]]
    assert state_at(scen, 59)["thunderbolt"]["devices"] == []
    assert len(state_at(scen, 121)["thunderbolt"]["devices"]) == 1


def test_mig_instances_hold_their_processes_and_one_leaks() -> None:
    scen = load_scenario("mig")
    gib = 1 << 30
    early, late, end = (state_at(scen, t)["devices"][0] for t in (60, 700, 1500))
    assert [m["profile"] for m in early["mig_devices"]] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    leaking = [m["mig_devices"][2]["processes"]["compute"][0]["used_memory"] for m in (early, late, end)]
    assert leaking[0] < 2 * gib < 5 * gib < leaking[1] < leaking[2] <= end["mig_devices"][2]["memory"]["total"]
    for dev in (early, late, end):
        steady = [m["processes"]["compute"][0]["used_memory"] for m in dev["mig_devices"][:2]]
        assert steady == [18 * gib, 11 * gib]
        # the GPU's used memory is the aggregate of its MIG devices' (a driver's answer for a GPU in MIG mode)
        assert dev["memory"]["used"] == sum(m["memory"]["used"] for m in dev["mig_devices"])
        assert dev["processes"]["compute"] == []


def test_underutilized_holds_memory_idle_then_computes() -> None:
    scen = load_scenario("underutilized")
    for t in (60, 900, 2300):
        idle, busy, h100 = state_at(scen, t)["devices"]
        assert idle["utilization"]["gpu"] <= 6 and busy["utilization"]["gpu"] >= 89
        assert h100["utilization"]["gpu"] == 35 and h100["gpm"]["sm_util"] == 2  # busy by NVML, idle by GPM
        assert proc(state_at(scen, t), 0, 4242)["used_memory"] == 52 * 1024 * MIB
        assert idle["process_utilization"][0]["pid"] == 4242 and idle["process_utilization"][0]["sm"] == 3
    idle, _, _ = state_at(scen, 2500)["devices"]
    assert idle["utilization"]["gpu"] >= 85 and idle["process_utilization"][0]["sm"] == 88
