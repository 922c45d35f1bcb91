"""The stand-in's NVLink field values and GPU recovery action, as nvml.h declares them, through the real pynvml."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpuwatchd.sim.state import make_device, make_state, write_state

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Sim

UINT_MAX = 2**32 - 1


def _link(
    tx: int, rx: int, flit: int | None = 0, data: int = 0, replay: int = 0, recovery: int = 0
) -> dict[str, int | None]:
    return {"tx_kib": tx, "rx_kib": rx, "crc_flit": flit, "crc_data": data, "replay": replay, "recovery": recovery}


def test_per_link_ids_scoped_throughput_and_recovery_action(sim: Sim) -> None:
    n = sim.nvml
    links = [_link(10, 20)] * 6 + [_link(1, 2), _link(5, 6, flit=None, data=7, replay=8, recovery=9)]
    dev = make_device(0, nvlink=[1] * 8, nvlink_counters=links, recovery_action=1)
    sim.update(make_state(0, devices=[dev, make_device(1)]))
    n.nvmlInit()
    a, b = sim.handles()
    ids = [
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 7),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_MAX),  # the sum over all links
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 8),  # past the last link
        (n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 + 1, 7),  # link 7 has its own _L7 id
        (n.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6 + 1, 7),
        (n.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6 + 1, 7),
        (n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6 + 1, 7),  # unset in the state
        n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    ]
    got = n.nvmlDeviceGetFieldValues(a, ids)
    ok = [(v.nvmlReturn, v.valueType, v.value.ullVal) for v in got[:3]]
    ull = n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert ok == [(0, ull, 5), (0, ull, 20), (0, ull, 6 * 10 + 1 + 5)]
    assert got[3].nvmlReturn == n.NVML_ERROR_INVALID_ARGUMENT
    assert [(v.nvmlReturn, v.value.ullVal) for v in got[4:7]] == [(0, 7), (0, 8), (0, 9)]
    assert got[7].nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED
    action = got[8]
    assert (action.nvmlReturn, action.valueType, action.value.uiVal) == (
        n.NVML_SUCCESS, n.NVML_VALUE_TYPE_UNSIGNED_INT, n.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    # a GPU without NVLink or recovery action: every value NOT_SUPPORTED, the call itself succeeds
    assert {v.nvmlReturn for v in n.nvmlDeviceGetFieldValues(b, ids)} == {n.NVML_ERROR_NOT_SUPPORTED}


def test_counters_are_checked(tmp_path: Path) -> None:
    bad = make_device(0, nvlink=[1], nvlink_counters=[{"crc_flit": -1}])
    with pytest.raises(ValueError, match=r"devices\[0\]\.nvlink_counters\[0\]\.crc_flit"):
        write_state(tmp_path / "s", make_state(0, devices=[bad]))
    with pytest.raises(ValueError, match=r"devices\[0\]\.nvlink_counters\[0\]\.crc: unknown key"):
        write_state(tmp_path / "s", make_state(0, devices=[make_device(0, nvlink_counters=[{"crc": 1}])]))
