"""MIG devices as devices (sources/nvml/worker/mig.py): the real worker and pynvml against the stand-in's MIG
handles."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import pytest
from mig_states import GIB, a100

from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.sources.nvml.worker.mig import profile_of
from tests.sources.workerutil import LiveWorker, run_worker, snap

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import StateWriter

PARENT = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
MIG0 = "MIG-aaaaaaaa-0000-5000-8000-000000000001"
MIG2 = "MIG-aaaaaaaa-0000-5000-8000-000000000002"


def test_instances_are_devices_after_their_gpu(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    path = write_sim_state(make_state(0, devices=[a100(), make_device(1)]))
    code, lines, err = run_worker(standin_libdir, path, max_polls=2)
    assert code == 0, err
    s = snap(lines[-1])
    gpu, m0, m2, other = s.gpus
    assert [g.uuid for g in s.gpus] == [PARENT, MIG0, MIG2, other.uuid]
    # The GPU keeps its physical readings and, in MIG mode, lists no processes itself (they are its instances').
    assert (gpu.power_watts, gpu.temperature_celsius, gpu.mig_mode_current, gpu.parent_uuid) == (25.0, 31.0, True,
                                                                                                  None)
    assert (gpu.processes, gpu.processes_total) == ((), None)
    assert (m0.index, m0.name, m0.parent_uuid, m0.gpu_instance_id, m0.compute_instance_id, m0.profile) == (
        0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", PARENT, 2, 0, "3g.40gb")
    assert (m0.memory_total_bytes, m0.memory_used_bytes, m0.memory_free_bytes) == (40 * GIB, 20 * GIB, 20 * GIB)
    assert [(p.pid, p.used_memory_bytes) for p in m0.processes] == [(4242, 19 * GIB)]
    assert (m2.profile, m2.gpu_instance_id, m2.processes_total) == ("1g.10gb", 9, 2)
    assert [(p.pid, p.used_memory_bytes) for p in m2.processes] == [(4343, 4 * GIB), (4344, None)]
    # Only per-instance readings: nothing physical is reported for a MIG device, and nothing failed.
    assert (m0.power_watts, m0.temperature_celsius, m0.clocks_hz, m0.pci_bus_id, m0.errors) == (None, None, {}, None,
                                                                                               {})
    assert (other.parent_uuid, other.processes_total) == (None, 0)


def test_per_poll_calls_on_instances(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    """After the first poll a MIG device costs its memory and compute-process calls; one empty slot is probed."""
    path = write_sim_state(make_state(0, devices=[a100()]))
    code, lines, err = run_worker(standin_libdir, path, max_polls=3, trace_calls=True)
    assert code == 0, err
    calls = lines[-1]["calls"]
    assert calls["nvmlDeviceGetMemoryInfo_v2"] == 3  # the GPU and its two instances
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # the instances only
    assert "nvmlDeviceGetGraphicsRunningProcesses_v3" not in calls  # learned absent on the instances
    assert calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 1  # one of the 5 empty slots of 7, in turn
    assert calls["nvmlDeviceGetPowerUsage"] == 1  # physical readings: the GPU only


def _destroy(state: dict[str, Any]) -> None:
    state["devices"][0]["mig_devices"].pop(0)


def _create(state: dict[str, Any]) -> None:
    state["devices"][0]["mig_devices"].append(
        {"index": 5, "uuid": "MIG-aaaaaaaa-0000-5000-8000-000000000005", "profile": "1g.10gb",
         "gpu_instance_id": 13, "memory": {"total": 10 * GIB, "used": 0}})


def _mig_off(state: dict[str, Any]) -> None:
    state["devices"][0].update(mig_mode=[0, 0], mig_devices=[])


@pytest.mark.parametrize(("change", "why"), [
    (_destroy, f"MIG device {MIG0} no longer answers"),
    (_create, "MIG device created at index 5"),
    (_mig_off, "MIG mode turned off"),
])
def test_changed_mig_configuration_reenumerates(standin_libdir: Path, write_sim_state: StateWriter,
                                                 change: Any, why: str) -> None:
    state = make_state(0, devices=[a100()])
    path = write_sim_state(state)
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        assert len(snap(w.next()).gpus) == 3
        changed = copy.deepcopy(state)
        change(changed)
        write_sim_state(changed)
        assert w.wait() == 3  # EXIT_REENUMERATE
        assert w.proc.stderr is not None
        assert f"exiting for a fresh enumeration: mig_config_changed: {PARENT}: {why}" in w.proc.stderr.read()
    finally:
        w.close()
    code, lines, err = run_worker(standin_libdir, path)  # the fresh worker sees the new configuration
    assert code == 0, err
    uuids = [g.uuid for g in snap(lines[0]).gpus]
    assert uuids == [PARENT, *(m["uuid"] for m in changed["devices"][0]["mig_devices"])]


def test_driver_without_mig_calls(write_sim_state: StateWriter) -> None:
    """A driver older than MIG (no nvmlDeviceGetMaxMigDeviceCount...): the GPU is read as before, no MIG devices."""
    from gpuwatchd.sim.build import build_standin

    lib = build_standin(omit=["nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
                              "nvmlDeviceGetMigDeviceHandleByIndex"])
    code, lines, err = run_worker(lib, write_sim_state(make_state(0, devices=[a100()])))
    assert code == 0, err
    (gpu,) = snap(lines[0]).gpus
    assert (gpu.uuid, gpu.mig_mode_current, gpu.processes_total) == (PARENT, None, 4)  # the aggregate list


def test_instance_reading_failure_is_per_poll(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = a100()
    dev["mig_devices"][1]["errors"] = {"nvmlDeviceGetComputeRunningProcesses_v3": "UNKNOWN"}
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), max_polls=2)
    assert code == 0, err
    m2 = snap(lines[-1]).gpus[2]
    assert (m2.uuid, m2.errors, m2.processes_total, m2.memory_used_bytes) == (
        MIG2, {"processes.compute": "unknown"}, None, 5 * GIB)


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb"), ("MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"), ("NVIDIA A100-SXM4-80GB", None), (None, None),
    ("NVIDIA AMIG 1g", None),
])
def test_profile_from_the_mig_device_name(name: str | None, profile: str | None) -> None:
    assert profile_of(name) == profile


def test_mig_mode_turned_on_reenumerates(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    off = make_state(0, devices=[a100(mig_mode=[0, 1], mig_devices=[])])
    path = write_sim_state(off)
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        (gpu,) = snap(w.next()).gpus
        assert (gpu.mig_mode_current, gpu.processes_total) == (False, 1)  # MIG off: the GPU's own processes
        write_sim_state(make_state(0, devices=[a100()]))  # after the reset that applies the pending mode
        assert w.wait() == 3
        assert w.proc.stderr is not None
        assert f"mig_config_changed: {PARENT}: MIG mode turned on" in w.proc.stderr.read()
    finally:
        w.close()


def test_gpm_activity_per_instance(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    """GPM on a Hopper in MIG mode: each MIG device has its GPU instance's activity (nvmlGpmMigSampleGet on the GPU),
    from the second poll on; the GPU keeps its own."""
    gpm = {"sm_util": 80.0, "dram_bw_util": 40.0,
           "instances": {"2": {"sm_util": 60.0, "dram_bw_util": 30.0}, "9": {"sm_util": 12.5}}}
    dev = a100(name="NVIDIA H100 80GB HBM3", gpm=gpm)
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), max_polls=3)
    assert code == 0, err
    first = snap(lines[0]).gpus
    assert [g.gpm_sm_activity_ratio for g in first] == [None, None, None]  # one sample: no metrics yet
    gpu, m0, m2 = snap(lines[-1]).gpus
    assert (gpu.gpm_sm_activity_ratio, m0.gpm_sm_activity_ratio, m2.gpm_sm_activity_ratio) == pytest.approx(
        (0.8, 0.6, 0.125))
    assert (m0.gpm_dram_activity_ratio, m2.gpm_dram_activity_ratio, m2.errors) == (pytest.approx(0.3), None, {})


def test_no_gpm_on_instances_of_a_gpu_without_it(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[a100()])), max_polls=3,
                                  trace_calls=True)
    assert code == 0, err
    assert all(g.gpm_sm_activity_ratio is None for g in snap(lines[-1]).gpus)
    assert not any(c.startswith("nvmlGpm") for c in lines[-1]["calls"])  # learned absent: nothing per poll


def test_a_mig_device_that_cannot_be_opened_is_left_out_once(standin_libdir: Path,
                                                              write_sim_state: StateWriter) -> None:
    dev = a100()
    dev["mig_devices"][0]["errors"] = {"nvmlDeviceGetUUID": "UNKNOWN"}
    # 8 polls: every one of the 5 empty slots is probed at least once; the failed slot would answer (a "new" MIG
    # device, so a re-enumeration) if it were probed too.
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), max_polls=8)
    assert code == 0, err
    assert "MIG device 0 of this GPU not opened (it is not reported): unknown" in err
    assert [g.uuid for g in snap(lines[-1]).gpus] == [PARENT, MIG2]


def test_an_invalid_argument_reading_of_a_live_instance_is_a_per_poll_error(standin_libdir: Path,
                                                                             write_sim_state: StateWriter) -> None:
    dev = a100()
    dev["mig_devices"][1]["errors"] = {"nvmlDeviceGetMemoryInfo_v2": "INVALID_ARGUMENT"}
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), max_polls=3)
    assert code == 0, err
    m2 = snap(lines[-1]).gpus[2]
    assert (m2.uuid, m2.errors, m2.memory_used_bytes) == (MIG2, {"memory_used_bytes": "invalid_argument"}, None)


def test_an_instance_replaced_at_its_index_reenumerates(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(0, devices=[a100()])
    path = write_sim_state(state)
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        assert len(snap(w.next()).gpus) == 3
        changed = copy.deepcopy(state)
        changed["devices"][0]["mig_devices"][0].update(uuid="MIG-aaaaaaaa-0000-5000-8000-0000000000ff",
                                                       gpu_instance_id=3)  # destroyed and created again
        changed["devices"][0]["mig_devices"][0]["errors"] = {"nvmlDeviceGetMemoryInfo_v2": "INVALID_ARGUMENT"}
        write_sim_state(changed)
        assert w.wait() == 3
        assert w.proc.stderr is not None
        assert f"mig_config_changed: {PARENT}: MIG device {MIG0} no longer answers" in w.proc.stderr.read()
    finally:
        w.close()


def test_an_instance_recreated_with_another_size_under_the_old_handle_reenumerates(
        standin_libdir: Path, write_sim_state: StateWriter) -> None:
    state = make_state(0, devices=[a100()])
    path = write_sim_state(state)
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        assert len(snap(w.next()).gpus) == 3
        changed = copy.deepcopy(state)  # the 1g.10gb at index 2 destroyed, a 2g.20gb created there
        changed["devices"][0]["mig_devices"][1].update(uuid="MIG-aaaaaaaa-0000-5000-8000-0000000000fe",
                                                       profile="2g.20gb", memory={"total": 20 * GIB, "used": 0})
        write_sim_state(changed)
        assert w.wait() == 3
        assert w.proc.stderr is not None
        assert (f"mig_config_changed: {PARENT}: MIG device {MIG2} changed size ({10 * GIB} -> {20 * GIB} bytes)"
                in w.proc.stderr.read())
    finally:
        w.close()
