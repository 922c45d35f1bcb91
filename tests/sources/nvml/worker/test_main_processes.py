"""The worker's process lists against the stand-in: C+G processes counted once, older drivers' process calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.capture import state_from_xml
from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml.protocol import LOG_LINE
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
MiB = 1 << 20
FIXTURE = Path(__file__).parents[3] / "sim" / "fixtures" / "new_schema_590.xml"

V3 = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")
V2 = ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2")
V1 = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")


def test_c_plus_g_capture_is_counted_once(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    # nvidia-smi shows pid 5151 once, as C+G with 10230 MiB; NVML lists it in both calls with that whole amount.
    state = state_from_xml(FIXTURE)
    code, lines, err = run_worker(standin_libdir, write_sim_state(state), top_n=10)
    assert code == 0, err
    g = snap(lines[0]).gpus[0]
    assert g.processes_total == 3
    assert [(p.pid, p.kind, p.used_memory_bytes) for p in g.processes] == [
        (4242, "compute", 30720 * MiB), (5151, "compute", 10230 * MiB), (6000, "compute", 10 * MiB)]
    assert next(p.name for p in g.processes if p.pid == 5151) == "memhog"


def _procs(n: int) -> dict[str, Any]:
    # Over the worker's first buffer (64) so the INSUFFICIENT_SIZE regrowth runs at each struct size; memory above
    # 2^32 and a WDDM-style unattributed entry so a wrong stride or field offset cannot pass.
    compute = [{"pid": 1000 + i, "used_memory": (5 << 30) + i} for i in range(n)]
    graphics = [{"pid": 9, "used_memory": None}, {"pid": 1000, "used_memory": 5 << 30}]  # 1000 is C+G
    return {"compute": compute, "graphics": graphics}


def _log_lines(err: str) -> list[str]:
    """Worker log messages about process calls, checked against the supervisor's line format."""
    out = []
    for line in err.splitlines():
        if "process" in line:
            m = LOG_LINE.fullmatch(line)
            assert m is not None, line
            out.append(f"{m.group(2)}: {m.group(3)}")
    return out


@pytest.mark.parametrize(("omit", "used", "api"), [
    (V3, V2, "v2"),
    (V3 + V2, V1, "v1 (unversioned)"),
])  # fmt: skip
def test_older_driver_process_calls(write_sim_state: StateWriter, omit: tuple[str, ...], used: tuple[str, ...],
                                    api: str) -> None:
    libdir = build_standin(omit=omit)
    devs = [make_device(i, processes=_procs(100)) for i in range(2)]
    code, lines, err = run_worker(libdir, write_sim_state(make_state(2, devices=devs)), top_n=3, max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        for g in snap(line).gpus:
            assert g.processes_total == 101 and g.errors == {}
            assert [(p.pid, p.kind, p.used_memory_bytes) for p in g.processes] == [
                (1099, "compute", (5 << 30) + 99), (1098, "compute", (5 << 30) + 98), (1097, "compute", (5 << 30) + 97)]
    # each missing symbol is looked up once per device at the first poll, then never again
    assert all(lines[0]["calls"][s] == 2 for s in omit)
    assert not set(omit) & set(lines[1]["calls"])
    assert all(lines[1]["calls"][s] == 2 for s in used)  # one call per device and poll: buffer kept
    uuids = [d["uuid"] for d in devs]
    assert _log_lines(err) == [f"INFO: GPU {u}: process lists via the NVML {api} calls ({used[0]}); this driver has "
                               "no *RunningProcesses_v3" for u in uuids]


def test_driver_without_any_process_call(write_sim_state: StateWriter) -> None:
    libdir = build_standin(omit=V3 + V2 + V1)
    dev = make_device(0, processes=_procs(3))
    code, lines, err = run_worker(libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert (g.processes_total, g.processes, g.errors) == (None, (), {})  # unknown, not "zero processes"
        assert g.temperature_celsius is not None  # the rest of the device is still read
    assert not set(V3 + V2 + V1) & set(lines[1]["calls"])
    assert _log_lines(err) == [f"WARNING: GPU {dev['uuid']}: no NVML process-list call in this driver (not even the "
                               "unversioned one); processes are not reported"]


def test_fallback_call_errors_are_per_poll(write_sim_state: StateWriter) -> None:
    # The fallback is chosen by a missing symbol only; an error from the older call is reported, and retried.
    libdir = build_standin(omit=V3)
    dev = make_device(0, processes=_procs(2), errors={"nvmlDeviceGetGraphicsRunningProcesses_v2": "NO_PERMISSION"})
    code, lines, err = run_worker(libdir, write_sim_state(make_state(1, devices=[dev])), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    for line in lines:
        g = snap(line).gpus[0]
        assert g.errors == {"processes.graphics": "no_permission"}
        assert g.processes_total == 2  # the compute list still answers
        assert line["calls"]["nvmlDeviceGetGraphicsRunningProcesses_v2"] == 1
        assert "nvmlDeviceGetGraphicsRunningProcesses" not in line["calls"]  # not a reason to go older


def test_not_supported_does_not_try_older_calls(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    # NOT_SUPPORTED is the device's answer; an older call would give the same, so none is tried.
    dev = make_device(0, processes={"compute": [{"pid": 5, "used_memory": 1}], "graphics": None})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(1, devices=[dev])), trace_calls=True)
    assert code == 0, err
    assert snap(lines[0]).gpus[0].processes_total == 1
    assert not {"nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses"} & set(
        lines[0]["calls"])
    assert _log_lines(err) == []


@pytest.mark.parametrize(("host_ns", "expected"), [(None, "gone"), (False, "hidden")])
def test_pids_without_a_process_reach_the_snapshot(standin_libdir: Path, write_sim_state: StateWriter,
                                                    host_ns: bool | None, expected: str) -> None:
    # The sim's /proc: pid 4242 has no entry (gone), 5151 is a zombie, 6161 lives; a daemon outside the host's
    # pid namespace (host_pid_namespace: false) cannot tell a missing pid from one in another container.
    procs = {"compute": [{"pid": 4242, "used_memory": 18 << 30, "host_state": "gone"},
                         {"pid": 5151, "used_memory": 2 << 30, "host_state": "zombie"},
                         {"pid": 6161, "used_memory": 1 << 30}], "graphics": []}
    state = make_state(0, devices=[make_device(0, processes=procs)])
    if host_ns is not None:
        state["host_pid_namespace"] = host_ns
    code, lines, err = run_worker(standin_libdir, write_sim_state(state), top_n=10)
    assert code == 0, err
    s = snap(lines[0])
    assert s.host_pid_namespace is (host_ns is not False)
    states = {p.pid: (p.host_state, p.host_state_seconds) for p in s.gpus[0].processes}
    assert states[4242][0] == expected and states[4242][1] is not None and states[4242][1] >= 0
    assert states[5151][0] == "zombie"
    assert states[6161] == ("live", None)
