"""Per-process utilization in the worker (sources/nvml/worker/process_util.py) against the stand-in: attached to the
kept top-N processes only, the older call as a fallback learned once, absent on a driver with neither call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
GiB = 1 << 30
T0 = 1_700_000_000_000_000
NEW, OLD = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"


def _device(i: int, **extra: Any) -> dict[str, Any]:
    procs = {"compute": [{"pid": 100, "used_memory": 3 * GiB}, {"pid": 101, "used_memory": 2 * GiB},
                         {"pid": 102, "used_memory": 1 * GiB}], "graphics": []}
    samples = [
        {"pid": 100, "timestamp_us": T0, "sm": 10, "memory": 1},  # an older period of pid 100
        {"pid": 100, "timestamp_us": T0 + 1000, "sm": 87, "memory": 45, "encoder": 2, "decoder": 3},
        {"pid": 102, "timestamp_us": T0 + 1000, "sm": 50, "memory": 50},  # not kept at top_n=2: not reported
    ]
    return make_device(i, processes=procs, process_utilization=samples, **extra)


def _util(line: dict[str, Any]) -> list[list[tuple[int, Any, Any, Any, Any]]]:
    return [[(p.pid, *(p.utilization_percent or (None,) * 4)) for p in g.processes] for g in snap(line).gpus]


def test_attached_to_the_kept_processes(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    idle = make_device(1)  # no processes: the call is not made at all
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[_device(0), idle])),
                                  top_n=2, max_polls=2, trace_calls=True)
    assert code == 0, err
    first, second = lines
    assert _util(first) == [[(100, 87, 45, 2, 3), (101, 0, 0, 0, 0)], []]
    assert snap(first).gpus[0].errors == {}
    # the same samples again are not newer than the last seen: NOT_FOUND, i.e. no utilization since the last poll
    assert _util(second) == [[(100, 0, 0, 0, 0), (101, 0, 0, 0, 0)], []]
    assert second["calls"][NEW] == 1 and OLD not in second["calls"]


def test_older_call_is_the_fallback(write_sim_state: StateWriter) -> None:
    libdir = build_standin(omit=(NEW,))
    devs = [_device(0), _device(1)]
    code, lines, err = run_worker(libdir, write_sim_state(make_state(0, devices=devs)), top_n=2, max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    assert _util(lines[0]) == [[(100, 87, 45, 2, 3), (101, 0, 0, 0, 0)]] * 2
    assert lines[0]["calls"][NEW] == 2 and NEW not in lines[1]["calls"]  # missing symbol learned once per device
    assert lines[1]["calls"][OLD] == 2
    for d in devs:
        assert f"GPU {d['uuid']}: per-process utilization via {OLD} (this driver has no {NEW})" in err


def test_absent_without_either_call(write_sim_state: StateWriter) -> None:
    libdir = build_standin(omit=(NEW, OLD))
    code, lines, err = run_worker(libdir, write_sim_state(make_state(0, devices=[_device(0)])), top_n=2,
                                  max_polls=2, trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert [p.utilization_percent for p in g.processes] == [None, None] and g.errors == {}
    assert NEW not in lines[1]["calls"] and OLD not in lines[1]["calls"]  # learned absent at the first poll


@pytest.mark.parametrize("code_name", ["UNKNOWN", "NO_PERMISSION"])
def test_a_failing_call_is_a_per_poll_error(standin_libdir: Path, write_sim_state: StateWriter,
                                            code_name: str) -> None:
    dev = _device(0, errors={NEW: code_name})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), top_n=2)
    assert code == 0, err
    g = snap(lines[0]).gpus[0]
    assert g.errors == {"processes.utilization": code_name.lower()}
    assert [p.utilization_percent for p in g.processes] == [None, None]  # unknown, not 0
    assert [p.used_memory_bytes for p in g.processes] == [3 * GiB, 2 * GiB]


def test_not_supported_device_exports_nothing(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = _device(0)
    dev["process_utilization"] = None  # e.g. a MIG-enabled GPU (nvml.h: not supported there)
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), top_n=2)
    assert code == 0, err
    g = snap(lines[0]).gpus[0]
    assert [p.utilization_percent for p in g.processes] == [None, None] and g.errors == {}


def test_struct_layouts_are_nvmls() -> None:
    import ctypes

    import pynvml

    from gpuwatchd.sources.nvml.worker import process_util as pu

    # array strides, trailing padding included (a 36-byte stride read the second sample 4 bytes off)
    assert pu._INFO_V1.size == ctypes.sizeof(pynvml.c_nvmlProcessUtilizationInfo_v1_t) == 40
    assert pu._SAMPLE.size == ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t) == 32
    assert pynvml.ProcessesUtilizationInfo_v1 == pu.INFO_VERSION_V1
