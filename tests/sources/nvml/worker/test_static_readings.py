"""What a board is, read when the GPU is opened and again every ``static_refresh_seconds`` (readings.STATIC_READINGS):
its last values sent in between, through the real pynvml and the stand-in driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml.worker.readings import STATIC_READINGS, readings
from tests.sources.workerutil import LiveWorker, run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
# the NVML symbols behind STATIC_READINGS on a current driver, with how many calls each makes for one GPU
STATIC_CALLS = {
    "nvmlDeviceGetTemperatureThreshold": 4,
    "nvmlDeviceGetPowerManagementLimitConstraints": 1,
    "nvmlDeviceGetPowerManagementDefaultLimit": 1,
    "nvmlDeviceGetMaxClockInfo": 4,
    "nvmlDeviceGetSupportedClocksEventReasons": 1,
    "nvmlDeviceGetMaxPcieLinkGeneration": 1,
    "nvmlDeviceGetMaxPcieLinkWidth": 1,
}
BOARD = {"temperature_thresholds": {"shutdown": 98, "slowdown": 95, "mem_max": 100, "gpu_max": 88},
         "power_default_limit_mw": 300000, "supported_clocks_event_reasons": 0x1FF}


def _board(g: Any) -> tuple[Any, ...]:
    return (g.temperature_slowdown_celsius, g.temperature_shutdown_celsius, g.temperature_gpu_max_celsius,
            g.temperature_memory_max_celsius, g.power_min_limit_watts, g.power_max_limit_watts,
            g.power_default_limit_watts, g.max_clocks_hz, g.clocks_event_reasons_supported, g.pcie_link_max_generation,
            g.pcie_link_max_width)


def test_every_static_reading_is_a_reading_of_the_worker() -> None:
    names = {name for name, _ in readings()}
    assert names >= STATIC_READINGS
    # what an administrator sets, or what moves, is read every poll
    assert not STATIC_READINGS & {"power_limit_watts", "ecc_mode_current", "clocks_event_reasons",
                                  "pcie_link_generation", "pcie_link_width", "temperature_celsius"}


def test_read_at_the_first_poll_and_given_again_after(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = write_sim_state(make_state(2, devices=[make_device(0, **BOARD), make_device(1, **BOARD)]))
    code, lines, err = run_worker(standin_libdir, state, max_polls=3, trace_calls=True)
    assert code == 0, err
    first = [_board(g) for g in snap(lines[0]).gpus]
    assert first[0] == (95.0, 98.0, 88.0, 100.0, 100.0, 300.0, 300.0,
                        {"graphics": 1710e6, "sm": 1710e6, "memory": 6251e6, "video": 1500e6}, 0x1FF, 4, 16)
    for line in lines:
        assert [_board(g) for g in snap(line).gpus] == first  # the same values in every line
        assert all(g.errors == {} for g in snap(line).gpus)
    for sym, n in STATIC_CALLS.items():
        assert lines[0]["calls"][sym] == 2 * n, sym  # both GPUs, once
        assert sym not in lines[1]["calls"] and sym not in lines[2]["calls"], sym
    assert lines[1]["calls"]["nvmlDeviceGetEnforcedPowerLimit"] == 2  # the limit in force: every poll


def test_a_refresh_of_zero_reads_them_every_poll(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[make_device(0, **BOARD)])),
                                  max_polls=2, trace_calls=True, static_refresh_seconds=0)
    assert code == 0, err
    for sym, n in STATIC_CALLS.items():
        assert lines[1]["calls"][sym] == n, sym


def test_kept_between_refreshes_then_read_again(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    """A change of a board's constants (only a stand-in's state can make one) is sent once a refresh reads it: not
    before with a refresh an hour away, and within a few refreshes with one of 0.3 s."""
    dev = make_device(0, **BOARD)
    path = write_sim_state(make_state(1, devices=[dev]))
    changed = make_device(0, **{**BOARD, "temperature_thresholds": {**BOARD["temperature_thresholds"], "slowdown": 90},
                                "max_clocks_mhz": {"graphics": 1500, "sm": 1500, "memory": 6251, "video": 1500}})
    w = LiveWorker(standin_libdir, path, static_refresh_seconds=3600)
    try:
        assert snap(w.next()).gpus[0].temperature_slowdown_celsius == 95.0
        write_sim_state(make_state(1, devices=[changed]))
        for _ in range(5):
            line = snap(w.next()).gpus[0]
            assert line.temperature_slowdown_celsius == 95.0 and line.max_clocks_hz["graphics"] == 1710e6
            assert line.temperature_celsius == 31.0  # the rest of the poll is read as always
    finally:
        w.close()
    write_sim_state(make_state(1, devices=[dev]))
    w = LiveWorker(standin_libdir, path, static_refresh_seconds=0.3)
    try:
        assert snap(w.next()).gpus[0].temperature_slowdown_celsius == 95.0
        write_sim_state(make_state(1, devices=[changed]))
        for _ in range(600):  # 0.05 s apart: 30 s, far beyond a refresh even on a loaded machine
            g = snap(w.next()).gpus[0]
            if g.temperature_slowdown_celsius == 90.0:
                break
        else:
            raise AssertionError("the changed threshold was never read again")
        assert g.max_clocks_hz["graphics"] == 1500e6  # every static reading refreshed with it
    finally:
        w.close()


def test_a_failing_static_reading_is_asked_again_each_poll(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    """Only values read are kept: a call that fails (not NOT_SUPPORTED) is retried at the next poll, as every
    reading is, and reported each time."""
    dev = make_device(0, errors={"nvmlDeviceGetPowerManagementDefaultLimit": "UNKNOWN"})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=3,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"power_default_limit_watts": "unknown"} and g.power_default_limit_watts is None
        assert line["calls"]["nvmlDeviceGetPowerManagementDefaultLimit"] == 1
        assert g.power_max_limit_watts == 300.0  # the others kept
    assert "nvmlDeviceGetPowerManagementLimitConstraints" not in lines[2]["calls"]
