"""GPM activity families: the gpm-training scenario through the real worker and pynvml into a promtool-clean
exposition, and nothing at all for GPUs without GPM (an A100, a real nvidia-smi capture replay)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.exporter import gpm_families
from gpuwatchd.exporter.families import Spec
from gpuwatchd.model import GpuSample
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.state import make_device, make_state
from gpuwatchd.store import Store
from tests.sources.workerutil import run_worker, snap

from .conftest import exposition, promtool_check, samples

StateWriter = Callable[[dict[str, Any]], Path]
GPM_NAMES = {v.name for v in vars(gpm_families).values() if isinstance(v, Spec)}
CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"
MIB = 2**20


def _exposition_after_two_polls(libdir: Path, state: Path) -> str:
    code, lines, err = run_worker(libdir, state, max_polls=2)  # GPM needs two samples: the second poll has them
    assert code == 0, err
    store = Store()
    store.apply(snap({**lines[-1], "timestamp": 1_700_000_000.0}))
    return exposition(store)


def test_gpm_training_is_exported_and_promtool_clean(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    scenario = load_scenario("gpm-training")
    state = state_at(scenario, 5.5)  # backward pass: t=5 s of the 10 s step
    text = _exposition_after_two_polls(standin_libdir, write_sim_state(state))
    result = promtool_check(text)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    got = {(s.name, s.labels.get("pipe") or s.labels.get("direction") or ""): s.value
           for s in samples(text) if s.name in GPM_NAMES and s.labels["uuid"] == state["devices"][3]["uuid"]}
    assert got == pytest.approx({
        ("gpuwatchd_gpu_graphics_engine_activity_ratio", ""): 0.99,
        ("gpuwatchd_gpu_sm_activity_ratio", ""): 0.94,
        ("gpuwatchd_gpu_sm_occupancy_ratio", ""): 0.45,
        ("gpuwatchd_gpu_tensor_activity_ratio", ""): 0.72,
        ("gpuwatchd_gpu_tensor_pipe_activity_ratio", "hmma"): 0.71,
        ("gpuwatchd_gpu_tensor_pipe_activity_ratio", "imma"): 0.0,
        ("gpuwatchd_gpu_tensor_pipe_activity_ratio", "dfma"): 0.0,
        ("gpuwatchd_gpu_tensor_pipe_activity_ratio", "dmma"): 0.0,
        ("gpuwatchd_gpu_pipe_activity_ratio", "fp64"): 0.0,
        ("gpuwatchd_gpu_pipe_activity_ratio", "fp32"): 0.12,
        ("gpuwatchd_gpu_pipe_activity_ratio", "fp16"): 0.03,
        ("gpuwatchd_gpu_pipe_activity_ratio", "integer"): 0.06,
        ("gpuwatchd_gpu_dram_activity_ratio", ""): 0.67,
        ("gpuwatchd_gpu_pcie_average_bytes_per_second", "tx"): 400 * MIB,
        ("gpuwatchd_gpu_pcie_average_bytes_per_second", "rx"): 300 * MIB,
        ("gpuwatchd_gpu_nvlink_average_bytes_per_second", "tx"): 120000 * MIB,
        ("gpuwatchd_gpu_nvlink_average_bytes_per_second", "rx"): 120000 * MIB,
    })
    assert {s.labels["uuid"] for s in samples(text) if s.name == "gpuwatchd_gpu_sm_activity_ratio"} == {
        d["uuid"] for d in state["devices"]}  # all eight H100s


def test_an_a100_exports_no_gpm_series(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    a100 = make_device(0, name="NVIDIA A100-SXM4-80GB", pci={"domain": 0, "bus": 7, "device": 0,
                                                           "pci_device_id": 0x20B210DE})
    text = _exposition_after_two_polls(standin_libdir, write_sim_state(make_state(0, devices=[a100])))
    names = {s.name for s in samples(text)}
    assert "gpuwatchd_gpu_temperature_celsius" in names
    assert names & GPM_NAMES == set()  # no series, not 0
    assert 'field="gpm' not in text  # and no error either: unsupported is not a failure


def test_a_capture_replay_exports_no_gpm_series(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    capture = CAPTURES / "xml05_a100-sxm4-80gb_535.54.03_mig-enabled.xml"
    if not capture.is_file():
        pytest.skip(f"real capture {capture.name} not available (shared captures folder {CAPTURES} absent)")
    from gpuwatchd.sim.capture import state_from_xml

    text = _exposition_after_two_polls(standin_libdir, write_sim_state(state_from_xml(capture)))
    names = {s.name for s in samples(text)}
    assert "gpuwatchd_gpu_memory_used_bytes" in names
    assert names & GPM_NAMES == set()


def test_no_reading_no_family() -> None:
    g = GpuSample(uuid="GPU-x", index=0)
    assert gpm_families.gpm_families([g]) == []
    h = GpuSample(uuid="GPU-h", index=1, gpm_sm_activity_ratio=0.0, gpm_pipe_activity_ratio={"fp64": 0.0})
    fams = {f.name: [(s.labels, s.value) for s in f.samples] for f in gpm_families.gpm_families([g, h])}
    assert fams == {"gpuwatchd_gpu_sm_activity_ratio": [({"uuid": "GPU-h"}, 0.0)],  # 0 is a reading
                    "gpuwatchd_gpu_pipe_activity_ratio": [({"uuid": "GPU-h", "pipe": "fp64"}, 0.0)]}
