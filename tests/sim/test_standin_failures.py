"""Failure paths of the stand-in: overrides, a lost GPU, hangs, delays, hot-plug across re-init, init errors."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import ERROR_CODES, make_device, make_state, write_state

if TYPE_CHECKING:
    from conftest import Sim


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


@pytest.mark.parametrize("name", sorted(ERROR_CODES))
def test_each_error_override_maps_to_its_pynvml_class(sim: Sim, name: str) -> None:
    n = sim.nvml
    assert getattr(n, f"NVML_ERROR_{name}") == ERROR_CODES[name]  # our table is nvml.h's
    dev = make_device(0, errors={"nvmlDeviceGetPowerUsage": name})
    sim.update(make_state(0, devices=[dev]))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError) as info:
        n.nvmlDeviceGetPowerUsage(h)
    assert info.value.value == ERROR_CODES[name]
    cls_name = "NVMLError_" + {"GPU_IS_LOST": "GpuIsLost", "IRQ_ISSUE": "IrqIssue"}.get(name, _camel(name))
    expected = getattr(n, cls_name, None) or getattr(n, "NVMLError_" + name.title().replace("_", ""))
    assert type(info.value) is expected
    assert n.nvmlDeviceGetTemperatureV(h, 0) == 31  # other calls are untouched


def test_wildcard_override_and_specific_one_wins(sim: Sim) -> None:
    n = sim.nvml
    dev = make_device(0, errors={"*": "NO_PERMISSION", "nvmlDeviceGetName": "UNKNOWN"})
    sim.update(make_state(0, devices=[dev, make_device(1)]))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)  # "*" does not cover handle lookups (docs/sim-state.md)
    with pytest.raises(n.NVMLError_NoPermission):
        n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    with pytest.raises(n.NVMLError_NoPermission):
        n.nvmlDeviceGetComputeRunningProcesses(h)
    with pytest.raises(n.NVMLError_Unknown):
        n.nvmlDeviceGetName(h)
    assert n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(1)) == "NVIDIA A10G"
    sim.update(make_state(0, devices=[make_device(0, errors={"nvmlDeviceGetHandleByIndex_v2": "NO_PERMISSION"})]))
    with pytest.raises(n.NVMLError_NoPermission):
        n.nvmlDeviceGetHandleByIndex(0)


def test_lost_gpu(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    lost, healthy = sim.handles()
    state = make_state(2)
    state["devices"][0]["lost"] = True
    sim.update(state)
    per_device = [
        lambda: n.nvmlDeviceGetUUID(lost), lambda: n.nvmlDeviceGetName(lost), lambda: n.nvmlDeviceGetIndex(lost),
        lambda: n.nvmlDeviceGetPciInfo(lost), lambda: n.nvmlDeviceGetMemoryInfo(lost, version=n.nvmlMemory_v2),
        lambda: n.nvmlDeviceGetUtilizationRates(lost), lambda: n.nvmlDeviceGetPowerUsage(lost),
        lambda: n.nvmlDeviceGetTemperature(lost, 0), lambda: n.nvmlDeviceGetClockInfo(lost, 0),
        lambda: n.nvmlDeviceGetComputeRunningProcesses(lost), lambda: n.nvmlDeviceGetRetiredPages(lost, 0),
        lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(lost), lambda: n.nvmlDeviceGetSupportedEventTypes(lost),
        lambda: n.nvmlDeviceGetHandleByIndex(0),
    ]  # fmt: skip
    for call in per_device:
        with pytest.raises(n.NVMLError_GpuIsLost):
            call()
    assert n.nvmlDeviceGetPowerUsage(healthy) == 25000
    assert n.nvmlDeviceGetCount() == 2  # count still lists it (nvml.h)
    with pytest.raises(n.NVMLError_GpuIsLost):  # nvml.h: ByUUID fails if *any* GPU is lost
        n.nvmlDeviceGetHandleByUUID(state["devices"][1]["uuid"].encode())


def test_removed_gpu_is_lost_until_reinit_then_reenumerated(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    first, second = sim.handles()
    state = make_state(3)
    gone = state["devices"].pop(0)  # surprise removal of GPU 0, plus a new GPU appearing
    sim.update(state)
    assert n.nvmlDeviceGetCount() == 2  # enumeration is fixed at init
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetUUID(first)
    assert n.nvmlDeviceGetUUID(second) == state["devices"][0]["uuid"]
    n.nvmlShutdown()
    n.nvmlInit()
    assert n.nvmlDeviceGetCount() == 2
    uuids = [n.nvmlDeviceGetUUID(h) for h in sim.handles()]
    assert uuids == [d["uuid"] for d in state["devices"]]
    assert gone["uuid"] not in uuids
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(state["devices"][0]["uuid"].encode())) == 0  # new index


def test_init_is_refcounted(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    n.nvmlInit()
    sim.update(make_state(4))
    n.nvmlShutdown()
    assert n.nvmlDeviceGetCount() == 2  # still the first session: no re-enumeration
    n.nvmlShutdown()
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()
    n.nvmlInit()
    assert n.nvmlDeviceGetCount() == 4
    assert sim.lib.nvmlInit_v2() == 0  # the C API's plain init shares the same refcount
    n.nvmlShutdown()
    assert n.nvmlDeviceGetCount() == 4


def test_no_gpus_and_init_errors(sim: Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    n = sim.nvml
    sim.update(make_state(0))
    with pytest.raises(n.NVMLError_GpuNotFound):
        n.nvmlInit()
    n.nvmlInitWithFlags(n.NVML_INIT_FLAG_NO_GPUS)
    assert n.nvmlDeviceGetCount() == 0
    n.nvmlShutdown()
    for name in ("DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "NO_PERMISSION"):
        sim.update(make_state(1, init_error=name))
        with pytest.raises(n.NVMLError) as info:
            n.nvmlInit()
        assert info.value.value == ERROR_CODES[name]
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "missing"))
    with pytest.raises(n.NVMLError_DriverNotLoaded):
        n.nvmlInit()
    monkeypatch.delenv(STATE_ENV)
    with pytest.raises(n.NVMLError_DriverNotLoaded):
        n.nvmlInit()


def test_state_path_is_read_at_init_not_at_load(sim: Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = tmp_path / "other-state"
    write_state(other, make_state(5))
    monkeypatch.setenv(STATE_ENV, str(other))
    sim.nvml.nvmlInit()
    assert sim.nvml.nvmlDeviceGetCount() == 5


def test_delay_in_milliseconds(sim: Sim) -> None:
    n = sim.nvml
    sim.update(make_state(0, devices=[make_device(0, delays_ms={"nvmlDeviceGetPowerUsage": 150})]))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    t0 = time.monotonic()
    assert n.nvmlDeviceGetPowerUsage(h) == 25000
    assert time.monotonic() - t0 >= 0.15  # at least the delay (no upper bound: the box is shared)


def test_gpu_lost_during_a_slow_call(sim: Sim) -> None:
    n = sim.nvml
    slow = make_state(0, devices=[make_device(0, delays_ms={"nvmlDeviceGetPowerUsage": 400})])
    sim.update(slow)
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    lost = copy.deepcopy(slow)
    lost["devices"][0]["lost"] = True
    timer = threading.Timer(0.1, write_state, args=(sim.path, lost))
    timer.start()
    try:
        with pytest.raises(n.NVMLError_GpuIsLost):  # the answer reflects the state when the call returns
            n.nvmlDeviceGetPowerUsage(h)
    finally:
        timer.join()


_HANG_CHILD = textwrap.dedent(
    """
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("ready", flush=True)
    print(pynvml.nvmlDeviceGetName(h), flush=True)
    pynvml.nvmlDeviceGetPowerUsage(h)
    print("returned", flush=True)
    """
)


def _spawn(libdir: Path, state: Path) -> subprocess.Popen[str]:
    # The real load path: pynvml's own CDLL("libnvidia-ml.so.1"), resolved through LD_LIBRARY_PATH.
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), STATE_ENV: str(state)}
    return subprocess.Popen([sys.executable, "-c", _HANG_CHILD], env=env, stdout=subprocess.PIPE, text=True)


@pytest.mark.timeout(30)
def test_hung_call_blocks_until_killed(standin_libdir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_state(state, make_state(0, devices=[make_device(0, delays_ms={"*": -1})]))
    with _spawn(standin_libdir, state) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"  # handle lookups are not covered by "*"
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)  # still blocked inside nvmlDeviceGetName after 1 s
            child.terminate()  # a hung driver call must not make the process unkillable
            assert child.wait(timeout=10) == -15
        finally:
            child.kill()


@pytest.mark.timeout(30)
def test_hang_ends_when_the_state_releases_it(standin_libdir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_state(state, make_state(0, devices=[make_device(0, delays_ms={"nvmlDeviceGetPowerUsage": -1})]))
    with _spawn(standin_libdir, state) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
            assert child.stdout.readline() == "NVIDIA A10G\n"  # other calls are not delayed
            with pytest.raises(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)
            write_state(state, make_state(1))
            assert child.stdout.read() == "returned\n"
            assert child.wait(timeout=10) == 0
        finally:
            child.kill()


def test_function_not_found_for_an_omitted_symbol(sim: Sim, load_standin: Any) -> None:
    libdir = build_standin(omit=("nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"))
    assert (libdir / "omit.txt").read_text().split() == [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTemperatureV",
    ]
    load_standin(libdir)
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlDeviceGetTemperatureV(h, 0)
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert n.nvmlDeviceGetTemperature(h, 0) == 31  # the old-driver fallbacks are there
    assert n.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 1


def test_missing_process_v3_symbol_is_pynvml_library_mismatch(sim: Sim, load_standin: Any) -> None:
    load_standin(build_standin(omit=("nvmlDeviceGetComputeRunningProcesses_v3",)))
    n = sim.nvml
    n.nvmlInit()
    with pytest.raises(n.NVMLLibraryMismatchError):  # plain Exception, not NVMLError (pynvml l.3131)
        n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(0))
