"""The worker's media-engine and default-power-limit readings, through the real pynvml and the stand-in driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
MEDIA = ("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
         "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetEncoderStats")


def test_readings_match_the_state_and_unset_ones_are_learned_once(
    standin_libdir: Path, write_sim_state: StateWriter
) -> None:
    devices = [
        make_device(0, encoder_utilization=0, decoder_utilization=45, power_default_limit_mw=300000,
                    power_limit_mw=250000,
                    encoder_stats={"session_count": 3, "average_fps": 59, "average_latency_us": 1500}),
        make_device(1),  # a board without NVENC/NVDEC readings or a default limit: NOT_SUPPORTED
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(2, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        a, b = snap(line).gpus
        # 0 % is a reading (exported as 0); unsupported is no reading (exported as nothing)
        assert (a.encoder_utilization_ratio, a.decoder_utilization_ratio) == (0.0, 0.45)
        assert (a.power_default_limit_watts, a.power_limit_watts) == (300.0, 250.0)
        assert (a.encoder_sessions, a.encoder_average_fps, a.encoder_average_latency_seconds) == (3, 59.0, 0.0015)
        assert (b.encoder_sessions, b.encoder_average_fps, b.encoder_average_latency_seconds) == (None, None, None)
        assert (b.encoder_utilization_ratio, b.decoder_utilization_ratio, b.power_default_limit_watts) == (
            None, None, None)
        assert a.errors == {} and b.errors == {}
    first, second = lines
    for sym in MEDIA:
        assert first["calls"][sym] == 2  # both GPUs asked once
        # then only the GPU that has it; the default limit is a board's constant (readings.STATIC_READINGS), given
        # again from the first read
        assert second["calls"].get(sym, 0) == (0 if sym == "nvmlDeviceGetPowerManagementDefaultLimit" else 1)


def test_errors_are_per_poll_and_an_older_driver_lacks_the_symbols(write_sim_state: StateWriter) -> None:
    dev = make_device(0, encoder_utilization=5, decoder_utilization=6,
                      errors={"nvmlDeviceGetEncoderUtilization": "UNKNOWN"})
    state = write_sim_state(make_state(1, devices=[dev]))
    code, lines, err = run_worker(build_standin(), state, max_polls=2, trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"encoder_utilization_ratio": "unknown"}
        assert (g.encoder_utilization_ratio, g.decoder_utilization_ratio) == (None, 0.06)
        assert line["calls"]["nvmlDeviceGetEncoderUtilization"] == 1  # a transient error is retried every poll
    old = build_standin(omit=("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization"))
    code, lines, err = run_worker(old, state, max_polls=2, trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert (g.encoder_utilization_ratio, g.decoder_utilization_ratio, g.errors) == (None, None, {})
    assert "nvmlDeviceGetDecoderUtilization" not in lines[1]["calls"]  # FUNCTION_NOT_FOUND: not looked up again


FIELDS = {"memory_temp": 71, "pcie_replay_rollover": 2, "pcie_correctable_errors": 12, "pcie_non_fatal_errors": 1,
          "pcie_fatal_errors": 0}


def test_field_values_in_one_call_and_unsupported_ids_are_dropped(
    standin_libdir: Path, write_sim_state: StateWriter
) -> None:
    devices = [
        make_device(0, field_values=FIELDS),
        make_device(1, field_values={"memory_temp": 40}),  # only the memory temperature: no PCIe counters
        make_device(2),  # no field values at all: the reading is dropped after the first poll
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(3, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        a, b, c = snap(line).gpus
        assert (a.memory_temperature_celsius, a.pcie_replay_rollover_total) == (71.0, 2)
        assert a.pcie_errors_total == {"correctable": 12, "non_fatal": 1, "fatal": 0}
        assert (b.memory_temperature_celsius, b.pcie_replay_rollover_total, b.pcie_errors_total) == (40.0, None, {})
        assert (c.memory_temperature_celsius, c.pcie_replay_rollover_total, c.pcie_errors_total) == (None, None, {})
        assert a.errors == b.errors == c.errors == {}
    assert lines[0]["calls"]["nvmlDeviceGetFieldValues"] == 3
    assert lines[1]["calls"]["nvmlDeviceGetFieldValues"] == 2


def test_field_values_call_error_is_per_poll(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = make_device(0, field_values=FIELDS, errors={"nvmlDeviceGetFieldValues": "UNKNOWN"})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"field_values": "unknown"} and g.memory_temperature_celsius is None
        assert line["calls"]["nvmlDeviceGetFieldValues"] == 1
