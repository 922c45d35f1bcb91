"""NVLink per link and the recovery action, read by the real worker through pynvml and the stand-in driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml.worker.nvlink import error_field_id
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]


def _counters(n: int, **link3: int) -> list[dict[str, int]]:
    base = {"tx_kib": 100, "rx_kib": 200, "crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0}
    return [{**base, **(link3 if i == 3 else {})} for i in range(n)]


def test_per_link_readings_in_the_one_field_values_call(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [
        # 14 links: 12 with error-counter ids, links 12-13 report state and throughput only (no _L12 id in nvml.h)
        make_device(0, nvlink=[1] * 13 + [0], nvlink_counters=_counters(14, crc_flit=41, crc_data=2, replay=1),
                    recovery_action=1, field_values={"memory_temp": 60}),
        make_device(1),  # no NVLink, no recovery action
    ]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(2, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        a, b = snap(line).gpus
        assert a.nvlink_links_active == 13
        assert a.nvlink_states == {**{str(i): 1 for i in range(13)}, "13": 0}
        assert a.nvlink_errors_total["3"] == {"crc_flit": 41, "crc_data": 2, "replay": 1, "recovery": 0}
        assert set(a.nvlink_errors_total) == {str(i) for i in range(12)}
        assert a.nvlink_transmit_bytes_total == {str(i): 100 * 1024 for i in range(14)}
        assert a.nvlink_receive_bytes_total["13"] == 200 * 1024
        assert (a.recovery_action, a.memory_temperature_celsius) == (1, 60.0)
        assert (b.nvlink_links_active, b.nvlink_states, b.nvlink_errors_total, b.recovery_action) == (
            None, {}, {}, None)
        assert a.errors == b.errors == {}
        assert line["calls"]["nvmlDeviceGetFieldValues"] == 2 - (line is lines[1])  # b's is dropped after poll 1
    # links are learned on the first poll (14 states + the INVALID_ARGUMENT past the last), then 14 per poll
    assert lines[0]["calls"]["nvmlDeviceGetNvLinkState"] == 15 + 14 + 1
    assert lines[1]["calls"]["nvmlDeviceGetNvLinkState"] == 14


def test_error_ids_follow_nvml_h() -> None:
    import pynvml as N

    assert error_field_id("crc_flit", 0) == N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0
    assert error_field_id("crc_data", 5) == N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L5
    assert error_field_id("replay", 6) == N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6
    assert error_field_id("recovery", 11) == N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L11
    assert error_field_id("crc_flit", 12) is None


def test_unset_counters_answer_nothing_per_value(
    standin_libdir: Path, write_sim_state: StateWriter
) -> None:
    dev = make_device(0, nvlink=[1, 1], nvlink_counters=[None, {"tx_kib": 1, "crc_flit": 5}])
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.nvlink_errors_total == {"1": {"crc_flit": 5}}  # link 0 and the unset counters: NOT_SUPPORTED
        assert g.nvlink_transmit_bytes_total == {"1": 1024}
        assert g.nvlink_receive_bytes_total == {}


def test_a_failing_link_state_call_leaves_the_device_wide_values(
    standin_libdir: Path, write_sim_state: StateWriter
) -> None:
    dev = make_device(0, nvlink=[1, 1], nvlink_counters=_counters(2), recovery_action=2,
                      errors={"nvmlDeviceGetNvLinkState": "UNKNOWN"})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"nvlink_links_active": "unknown"}  # one line says it; the other values still come
        assert (g.recovery_action, g.nvlink_errors_total, g.nvlink_links_active) == (2, {}, None)
        assert line["calls"]["nvmlDeviceGetFieldValues"] == 1
