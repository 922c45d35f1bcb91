"""The NVML worker process against the stand-in driver: fields, capability cache, fallbacks, processes, loss."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import WORKER, LiveWorker, run_worker, snap, worker_env

StateWriter = Callable[[dict[str, Any]], Path]
GiB = 1 << 30


def _busy_device(i: int) -> dict[str, Any]:
    """A device where every reading has a distinct non-default value, so a mix-up cannot pass."""
    return make_device(
        i,
        memory={"total": 24 * GiB, "reserved": 333774848, "used": 5 * GiB},
        utilization={"gpu": 37, "memory": 12},
        temperature=54,
        temperature_thresholds={"shutdown": 98, "slowdown": 95, "mem_max": 93, "gpu_max": 88},
        power_usage_mw=70500,
        power_limit_mw=250000,
        power_constraints_mw=[100000, 300000],
        energy_mj=123456789,
        clocks_mhz={"graphics": 1710, "sm": 1705, "memory": 6250, "video": 1500},
        max_clocks_mhz={"graphics": 1800, "sm": 1801, "memory": 6251, "video": 1600},
        clocks_event_reasons=0x4 | 0x8,
        supported_clocks_event_reasons=0x1FF,
        violation_ns={"power": 2_000_000_000, "thermal": 500_000_000, "sync_boost": 0, "board_limit": 0,
                      "low_utilization": 0, "reliability": 0, "total_app_clocks": 0, "total_base_clocks": 0},
        pstate=2,
        fans=[30, 31],
        ecc_mode=[1, 0],
        ecc_errors={"corrected_volatile": 1, "uncorrected_volatile": 2, "corrected_aggregate": 3,
                    "uncorrected_aggregate": 4},
        retired_pages={"sbe": [4096, 8192], "dbe": [12288], "pending": True},
        remapped_rows={"correctable": 5, "uncorrectable": 1, "pending": True, "failure": False},
        pcie={"gen": 3, "max_gen": 4, "gpu_max_gen": 4, "width": 8, "max_width": 16, "tx_kbps": 1200, "rx_kbps": 800,
              "replay_counter": 7},
        nvlink=[1, 1, 0],
        mig_mode=[0, 0],
    )


def test_every_field_matches_the_state(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(2, devices=[_busy_device(0), make_device(1)])
    code, lines, err = run_worker(standin_libdir, write_sim_state(state))
    assert code == 0, err
    s = snap(lines[0])
    assert (s.nvml_ok, s.device_count, s.driver_version, s.nvml_version, s.cuda_driver_version) == (
        True, 2, "535.161.08", "12.535.161.08", 12020)
    g = s.gpus[0]
    d = state["devices"][0]
    assert (g.uuid, g.index, g.name, g.serial, g.pci_bus_id) == (d["uuid"], 0, "NVIDIA A10G", d["serial"],
                                                                 "00000000:0C:00.0")
    assert (g.memory_total_bytes, g.memory_used_bytes, g.memory_reserved_bytes, g.memory_free_bytes) == (
        24 * GiB, 5 * GiB, 333774848, 24 * GiB - 5 * GiB - 333774848)
    assert (g.utilization_gpu_ratio, g.utilization_memory_ratio, g.pstate) == (0.37, 0.12, 2)
    assert (g.temperature_celsius, g.temperature_slowdown_celsius, g.temperature_shutdown_celsius,
            g.temperature_gpu_max_celsius, g.temperature_memory_max_celsius) == (54, 95, 98, 88, 93)
    assert g.fan_speed_ratios == (0.30, 0.31)
    assert (g.power_watts, g.power_limit_watts, g.power_min_limit_watts, g.power_max_limit_watts) == (
        70.5, 250, 100, 300)
    assert g.energy_joules == pytest.approx(123456.789)
    assert g.clocks_hz == {"graphics": 1710e6, "sm": 1705e6, "memory": 6250e6, "video": 1500e6}
    assert g.max_clocks_hz == {"graphics": 1800e6, "sm": 1801e6, "memory": 6251e6, "video": 1600e6}
    assert (g.clocks_event_reasons, g.clocks_event_reasons_supported) == (0xC, 0x1FF)
    assert g.violation_seconds["power"] == pytest.approx(2.0)
    assert g.violation_seconds["thermal"] == pytest.approx(0.5)
    assert (g.ecc_mode_current, g.ecc_mode_pending) == (True, False)
    assert (g.ecc_corrected_volatile, g.ecc_uncorrected_volatile, g.ecc_corrected_aggregate,
            g.ecc_uncorrected_aggregate) == (1, 2, 3, 4)
    assert (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) == (2, 1, True)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable, g.remapped_rows_pending,
            g.remapped_rows_failure) == (5, 1, True, False)
    assert (g.pcie_link_generation, g.pcie_link_max_generation, g.pcie_link_width, g.pcie_link_max_width) == (
        3, 4, 8, 16)
    assert (g.pcie_tx_bytes_per_second, g.pcie_rx_bytes_per_second, g.pcie_replay_total) == (
        1200 * 1024, 800 * 1024, 7)
    assert (g.nvlink_links_active, g.mig_mode_current) == (2, False)
    assert g.errors == {}
    # the default device has no mem_max threshold, no NVLink and no MIG: no reading, not zero
    other = s.gpus[1]
    assert (other.temperature_memory_max_celsius, other.nvlink_links_active, other.mig_mode_current) == (
        None, None, None)


def test_not_supported_is_learned_once(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = make_device(0, power_usage_mw=None, fans=None, energy_mj=None, remapped_rows=None)
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=3,
                                  trace_calls=True)
    assert code == 0, err
    first, second, third = lines
    for line in lines:
        g = snap(line).gpus[0]
        assert (g.power_watts, g.fan_speed_ratios, g.energy_joules, g.remapped_rows_uncorrectable) == (
            None, None, None, None)
        assert g.temperature_celsius == 31 and g.errors == {}
    for sym in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetNumFans", "nvmlDeviceGetTotalEnergyConsumption",
                "nvmlDeviceGetRemappedRows"):
        assert first["calls"][sym] == 1
        assert sym not in second["calls"] and sym not in third["calls"]
    assert second["calls"]["nvmlDeviceGetTemperatureV"] == 1  # supported readings are still polled


OLD_DRIVER = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons",
              "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetEnforcedPowerLimit")


def test_old_driver_fallbacks(write_sim_state: StateWriter) -> None:
    libdir = build_standin(omit=OLD_DRIVER)
    dev = make_device(0, memory={"total": 16 * GiB, "reserved": 1000, "used": 2 * GiB}, temperature=61,
                      clocks_event_reasons=0x20, supported_clocks_event_reasons=0x7F, power_limit_mw=200000)
    code, lines, err = run_worker(libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.temperature_celsius == 61
        assert (g.memory_total_bytes, g.memory_used_bytes, g.memory_reserved_bytes) == (16 * GiB, 2 * GiB + 1000,
                                                                                         None)  # v1: used+reserved
        assert (g.clocks_event_reasons, g.clocks_event_reasons_supported) == (0x20, 0x7F)
        assert g.power_limit_watts == 200
    calls = lines[1]["calls"]
    assert not set(OLD_DRIVER) & set(calls)  # the missing symbols are not looked up again
    for sym in ("nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCurrentClocksThrottleReasons",
                "nvmlDeviceGetPowerManagementLimit"):
        assert calls[sym] == 1
    # the supported reasons are a board's constant (readings.STATIC_READINGS): read through the fallback at the
    # first poll, given again since
    assert lines[0]["calls"]["nvmlDeviceGetSupportedClocksThrottleReasons"] == 1
    assert "nvmlDeviceGetSupportedClocksThrottleReasons" not in calls


def test_transient_errors_are_per_poll_and_retried(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = make_device(0, errors={"nvmlDeviceGetPowerUsage": "UNKNOWN",
                                 "nvmlDeviceGetUtilizationRates": "NO_PERMISSION"})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"power_watts": "unknown", "utilization_gpu_ratio": "no_permission"}
        assert g.power_watts is None and g.temperature_celsius == 31
        assert line["calls"]["nvmlDeviceGetPowerUsage"] == 1


def test_processes_top_n_merge_and_wddm(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    compute = [{"pid": 100 + i, "used_memory": (i + 1) * 1_000_000, "name": f"job{i}", "user": "alice",
                "host_rss": 1_000} for i in range(20)]
    graphics = [{"pid": 119, "used_memory": 19_999_000, "name": "job19", "user": "alice"},  # C+G: counted once
                {"pid": 7, "used_memory": None, "name": "Xorg", "user": "root"}]  # WDDM-style: unattributed
    dev = make_device(0, processes={"compute": compute, "graphics": graphics})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), top_n=3)
    assert code == 0, err
    g = snap(lines[0]).gpus[0]
    assert g.processes_total == 21
    assert [(p.pid, p.kind, p.used_memory_bytes) for p in g.processes] == [
        (119, "compute", 20_000_000), (118, "compute", 19_000_000), (117, "compute", 18_000_000)]
    assert (g.processes[0].name, g.processes[0].user, g.processes[0].host_rss_bytes) == ("job19", "alice", 1_000)
    code, lines, _ = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), top_n=100)
    xorg = [p for p in snap(lines[0]).gpus[0].processes if p.pid == 7]
    assert [(p.kind, p.used_memory_bytes, p.name) for p in xorg] == [("graphics", None, "Xorg")]


def test_xid_events_are_drained_once(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(2)
    uuid1 = state["devices"][1]["uuid"]
    state["events"] = [{"seq": 1, "uuid": uuid1, "type": "xid", "data": 13}]  # before registration: not recorded
    w = LiveWorker(standin_libdir, write_sim_state(state), interval=0.05)
    try:
        assert snap(w.next()).xid_events == ()
        state["events"] += [{"seq": 2, "uuid": uuid1, "type": "xid", "data": 79},
                            {"seq": 3, "uuid": uuid1, "type": "xid", "data": 48}]
        write_sim_state(state)
        s = snap(w.next())
        while not s.xid_events:
            s = snap(w.next())
        assert [(e.uuid, e.xid, e.source) for e in s.xid_events] == [(uuid1, 79, "nvml"), (uuid1, 48, "nvml")]
        assert snap(w.next()).xid_events == ()  # delivered once
    finally:
        w.close()


def test_events_not_supported_is_not_unhealthy(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(1, devices=[make_device(0, supported_event_types=0)])
    code, lines, err = run_worker(standin_libdir, write_sim_state(state))
    assert code == 0, err
    assert snap(lines[0]).gpus[0].errors == {} and snap(lines[0]).lost == ()


def test_gpu_lost_at_start_is_reported_and_others_polled(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(2)
    state["devices"][0]["lost"] = True
    code, lines, err = run_worker(standin_libdir, write_sim_state(state), max_polls=2)
    assert code == 0, err  # already lost at enumeration: a fresh worker would see the same, so no exit
    for line in lines:
        s = snap(line)
        assert [g.index for g in s.gpus] == [1]
        assert [(x.index, x.reason) for x in s.lost] == [(0, "gpu_is_lost")]


def test_unplug_while_running_reports_lost_then_exits(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(2)
    path = write_sim_state(state)
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        assert len(snap(w.next()).gpus) == 2
        gone = state["devices"][0]
        write_sim_state(make_state(1, devices=[state["devices"][1]]))  # Thunderbolt cable pulled
        s = snap(w.next())
        while not s.lost:
            s = snap(w.next())
        assert [(x.uuid, x.pci_bus_id, x.reason) for x in s.lost] == [(gone["uuid"], "00000000:0C:00.0",
                                                                      "gpu_is_lost")]
        assert [g.uuid for g in s.gpus] == [state["devices"][1]["uuid"]]
        assert w.wait() == 3  # EXIT_REENUMERATE
    finally:
        w.close()
    code, lines, _ = run_worker(standin_libdir, path)
    assert code == 0
    s = snap(lines[0])
    assert (s.device_count, [g.uuid for g in s.gpus], s.lost) == (1, [state["devices"][1]["uuid"]], ())


@pytest.mark.parametrize(("init_error", "reason"), [("DRIVER_NOT_LOADED", "driver_not_loaded"),
                                                     ("LIB_RM_VERSION_MISMATCH", "lib_rm_version_mismatch"),
                                                     ("NO_PERMISSION", "no_permission")])
def test_init_failure_snapshot(standin_libdir: Path, write_sim_state: StateWriter, init_error: str,
                               reason: str) -> None:
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, init_error=init_error)))
    assert code == 2
    assert [(snap(x).nvml_ok, snap(x).nvml_error) for x in lines] == [(False, reason)]
    assert reason in err


def test_no_library(tmp_path: Path, write_sim_state: StateWriter) -> None:
    code, lines, err = run_worker(tmp_path, write_sim_state(make_state(1)),
                                  library_path=str(tmp_path / "libnvidia-ml.so.1"))
    assert code == 2
    assert "library_not_found" in err
    assert snap(lines[0]).nvml_error == "library_not_found"


def test_driver_without_gpus_is_up_with_zero(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0)))
    assert code == 0, err
    s = snap(lines[0])
    assert (s.nvml_ok, s.device_count, s.gpus) == (True, 0, ())


def test_many_processes_and_unsupported_process_list(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    compute = [{"pid": 1000 + i, "used_memory": 4096 * (i + 1)} for i in range(300)]  # past the initial buffer
    dev = make_device(0, processes={"compute": compute, "graphics": None})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), top_n=1000,
                                  max_polls=2, trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.processes_total == 300 and g.errors == {}
        assert sorted(p.pid for p in g.processes) == list(range(1000, 1300))
        assert g.processes[0] == g.processes[0].__class__(pid=1299, kind="compute", used_memory_bytes=4096 * 300,
                                                          host_state="live")
    assert lines[0]["calls"]["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 1
    assert "nvmlDeviceGetGraphicsRunningProcesses_v3" not in lines[1]["calls"]  # NOT_SUPPORTED learned once
    assert lines[1]["calls"]["nvmlDeviceGetComputeRunningProcesses_v3"] == 1  # one call per poll, buffer kept


def test_worker_dies_with_its_parent_even_when_hung(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    """A daemon killed with SIGKILL must not leave a worker blocked in the driver behind (PR_SET_PDEATHSIG)."""
    path = write_sim_state(make_state(1, devices=[make_device(0, delays_ms={"*": -1})]))
    parent_code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen({WORKER!r} + [{json.dumps({'interval': 0.05})!r}], stdout=subprocess.PIPE)\n"
        "p.stdout.readline()\n"  # hello: the worker is up and about to block in the driver
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=worker_env(standin_libdir, path),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = psutil.Process(int(parent.stdout.readline()))
        assert worker.is_running()
        parent.kill()
        parent.wait()
        gone, alive = psutil.wait_procs([worker], timeout=20)
        assert alive == [] and len(gone) == 1
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_every_snapshot_accounts_for_every_gpu_while_slow_calls_are_set_aside(
    standin_libdir: Path, write_sim_state: StateWriter
) -> None:
    """A successful snapshot without a GPU, in neither its GPUs nor its lost list, reads as that GPU's removal.

    Two GPUs answer one call 30 ms late, past a 20 ms stall limit: they are set aside poll after poll, and their
    abandoned calls return while the next poll runs (the race that once showed a GPU removed under CPU load).
    """
    devices = [make_device(i, delays_ms={"nvmlDeviceGetPowerUsage": 30} if i in (1, 2) else {}) for i in range(4)]
    path = write_sim_state(make_state(0, devices=devices))
    uuids = {d["uuid"] for d in devices}
    w = LiveWorker(standin_libdir, path, interval=0.01, stall_after=0.02)
    try:
        snaps = [snap(w.next()) for _ in range(60)]
    finally:
        w.close()
    for s in snaps:
        assert s.nvml_ok
        assert {g.uuid for g in s.gpus} | {x.uuid for x in s.lost} == uuids, s
        assert {x.reason for x in s.lost} <= {"hang_suspected"}
    assert any(s.lost for s in snaps), "no GPU was ever set aside: the test did not exercise the path"
