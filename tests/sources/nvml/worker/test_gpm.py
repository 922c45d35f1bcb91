"""The worker's GPM reading through the real pynvml and the stand-in: two-sample metrics, support, errors, buffers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import make_device, make_state
from tests.sources.conftest import InProcessNvml
from tests.sources.workerutil import LiveWorker, run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
GPM = {"graphics_util": 97, "sm_util": 82.5, "sm_occupancy": 40, "any_tensor_util": 61, "hmma_tensor_util": 58,
       "imma_tensor_util": 0, "dfma_tensor_util": None, "dmma_tensor_util": None, "dram_bw_util": 66.25,
       "fp64_util": 0, "fp32_util": 14, "fp16_util": 3, "integer_util": 9, "pcie_tx_per_sec": 512,
       "pcie_rx_per_sec": 3072, "nvlink_total_tx_per_sec": 140000, "nvlink_total_rx_per_sec": 139000}
MIB = 1 << 20
GPM_FIELDS = ("gpm_graphics_activity_ratio", "gpm_sm_activity_ratio", "gpm_sm_occupancy_ratio",
              "gpm_tensor_activity_ratio", "gpm_tensor_pipe_activity_ratio", "gpm_pipe_activity_ratio",
              "gpm_dram_activity_ratio", "gpm_pcie_bytes_per_second", "gpm_nvlink_bytes_per_second")
GPM_SYMBOLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
               "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")


def _no_gpm(g: Any) -> bool:
    return all(getattr(g, f) in (None, {}) for f in GPM_FIELDS)


def test_metrics_from_the_second_poll_in_base_units(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [make_device(0, name="NVIDIA H100 80GB HBM3", gpm=GPM), make_device(1)]  # an A10G: no GPM
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=devices)), max_polls=3,
                                  trace_calls=True)
    assert code == 0, err
    first, *later = lines
    assert all(_no_gpm(g) for g in snap(first).gpus)  # one sample is no measurement: nothing, not 0
    for line in later:
        h100, a10g = snap(line).gpus
        assert h100.gpm_graphics_activity_ratio == pytest.approx(0.97)
        assert h100.gpm_sm_activity_ratio == pytest.approx(0.825)
        assert h100.gpm_sm_occupancy_ratio == pytest.approx(0.40)
        assert h100.gpm_tensor_activity_ratio == pytest.approx(0.61)
        assert h100.gpm_tensor_pipe_activity_ratio == pytest.approx({"hmma": 0.58, "imma": 0.0})
        assert h100.gpm_pipe_activity_ratio == pytest.approx({"fp64": 0.0, "fp32": 0.14, "fp16": 0.03,
                                                             "integer": 0.09})
        assert h100.gpm_dram_activity_ratio == pytest.approx(0.6625)
        assert h100.gpm_pcie_bytes_per_second == pytest.approx({"tx": 512 * MIB, "rx": 3072 * MIB})
        assert h100.gpm_nvlink_bytes_per_second == pytest.approx({"tx": 140000 * MIB, "rx": 139000 * MIB})
        assert h100.errors == {} and a10g.errors == {}
        assert _no_gpm(a10g)
    # Support is asked once per GPU; the GPU without GPM costs nothing after that; one sample per poll.
    assert first["calls"]["nvmlGpmQueryDeviceSupport"] == 2
    assert first["calls"]["nvmlGpmSampleAlloc"] == 2  # two buffers, for the H100 only
    for line in later:
        assert "nvmlGpmQueryDeviceSupport" not in line["calls"] and "nvmlGpmSampleAlloc" not in line["calls"]
        assert (line["calls"]["nvmlGpmSampleGet"], line["calls"]["nvmlGpmMetricsGet"]) == (1, 1)


def test_a_failing_metric_drops_only_that_metric(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    dev = make_device(0, gpm={**GPM, "metric_errors": {"sm_occupancy": "UNKNOWN"}})
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=[dev])), max_polls=3)
    assert code == 0, err
    for line in lines[1:]:
        g = snap(line).gpus[0]
        assert g.errors == {"gpm_sm_occupancy_ratio": "unknown"}  # retried, and reported, every poll
        assert g.gpm_sm_occupancy_ratio is None
        assert g.gpm_sm_activity_ratio == pytest.approx(0.825)


def test_a_failing_sample_is_an_error_then_a_fresh_pair(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    failing = make_device(0, gpm=GPM, errors={"nvmlGpmSampleGet": "UNKNOWN"})
    path = write_sim_state(make_state(0, devices=[failing]))
    w = LiveWorker(standin_libdir, path, interval=0.05)
    try:
        for _ in range(2):
            g = snap(w.next()).gpus[0]
            assert g.errors == {"gpm": "unknown"} and _no_gpm(g)
            assert g.memory_used_bytes is not None  # the other readings go on
        write_sim_state(make_state(0, devices=[make_device(0, gpm=GPM)]))
        for _ in range(100):  # the state change is seen within a poll or two; then one sample, then metrics
            g = snap(w.next()).gpus[0]
            if g.errors == {}:
                break
        assert _no_gpm(g)  # the first good sample after the failure has no partner
        g = snap(w.next()).gpus[0]
        assert g.gpm_sm_activity_ratio == pytest.approx(0.825)
    finally:
        w.close()


@pytest.mark.parametrize("omit", [GPM_SYMBOLS, ("nvmlGpmMetricsGet",), ("nvmlGpmQueryDeviceSupport",)])
def test_a_driver_without_gpm_degrades_silently(write_sim_state: StateWriter, omit: tuple[str, ...]) -> None:
    state = write_sim_state(make_state(0, devices=[make_device(0, gpm=GPM), make_device(1, gpm=GPM)]))
    code, lines, err = run_worker(build_standin(omit=omit), state, max_polls=3, trace_calls=True)
    assert code == 0, err
    assert "gpm" not in err.lower() and "WARNING" not in err  # no log line, let alone one per poll
    for line in lines:
        for g in snap(line).gpus:
            assert g.errors == {} and _no_gpm(g)
            assert g.memory_used_bytes is not None
    assert not any(s.startswith("nvmlGpm") for s in lines[-1]["calls"])  # learned absent: no call any more


def test_unsupported_device_and_lost_gpu(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    devices = [make_device(0, gpm={**GPM, "supported": False}),
               make_device(1, gpm=GPM, errors={"nvmlGpmSampleGet": "GPU_IS_LOST"})]
    code, lines, err = run_worker(standin_libdir, write_sim_state(make_state(0, devices=devices)), max_polls=2,
                                  trace_calls=True)
    assert code == 0, err
    s = snap(lines[0])
    assert [g.index for g in s.gpus] == [0] and _no_gpm(s.gpus[0])
    assert [(lost.index, lost.reason) for lost in s.lost] == [(1, "gpu_is_lost")]
    assert lines[0]["calls"]["nvmlGpmSampleFree"] == 2  # the lost GPU's buffers are freed at once


# -- in-process: the sample buffers' life, and MIG instances ------------------------------------------------------


@pytest.fixture
def nvml(inprocess_nvml: InProcessNvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """pynvml in this process on the stand-in, with the GPM allocations counted (the real calls still run)."""
    import ctypes

    pynvml = inprocess_nvml(make_state(0, devices=[make_device(0, gpm={**GPM, "instances": {"3": {"sm_util": 25}}}),
                                                   make_device(1)]))
    live: set[int] = set()
    alloc, free = pynvml.nvmlGpmSampleAlloc, pynvml.nvmlGpmSampleFree

    def counted_alloc() -> Any:
        s = alloc()
        live.add(ctypes.addressof(s.contents))
        return s

    def counted_free(s: Any) -> None:
        free(s)
        live.remove(ctypes.addressof(s.contents))

    monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", counted_alloc)
    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", counted_free)
    pynvml.live_gpm_samples = live
    yield pynvml
    del pynvml.live_gpm_samples


def test_buffers_are_allocated_once_and_freed_when_the_worker_closes(nvml: Any) -> None:
    from gpuwatchd.sources.nvml.worker.session import Worker

    w = Worker(0, None)
    w.start()
    for _ in range(4):
        snapshot = w.poll()
        assert snapshot is not None
    assert len(nvml.live_gpm_samples) == 2  # the H100's pair, reused every poll
    assert snapshot["gpus"][0]["gpm_sm_activity_ratio"] == pytest.approx(0.825)
    w.close()
    assert nvml.live_gpm_samples == set()


def test_a_gpu_instance_is_sampled_on_its_own(nvml: Any) -> None:
    from gpuwatchd.sources.nvml.worker.gpm import GpmSampler

    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    whole, instance, missing = GpmSampler(h), GpmSampler(h, gpu_instance_id=3), GpmSampler(h, gpu_instance_id=5)
    outs: list[dict[str, Any]] = [{}, {}, {}]
    errors: list[dict[str, str]] = [{}, {}, {}]
    for _ in range(2):
        for s, out, err in zip((whole, instance, missing), outs, errors, strict=True):
            s.read(out, err)
    assert outs[0]["gpm_sm_activity_ratio"] == pytest.approx(0.825)
    assert outs[1] == {"gpm_sm_activity_ratio": pytest.approx(0.25)}  # only what the instance reports
    assert (outs[2], errors[2]) == ({}, {"gpm": "not_found"})
    for s in (whole, instance, missing):
        s.close()
    assert nvml.live_gpm_samples == set()


def test_samples_are_kept_nvmls_100ms_apart(nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the daemon (gpm_min_interval 0.1 s, nvml.h's refresh rate) a poll closer than that to the last sample
    takes none and repeats the last metrics: a 10 ms poll interval never computes GPM from counters that have not
    refreshed."""
    from gpuwatchd.sources.nvml.protocol import GPM_MIN_SAMPLE_INTERVAL
    from gpuwatchd.sources.nvml.worker.gpm import GpmSampler

    now = [1000.0]
    monkeypatch.setattr(GpmSampler, "min_interval", GPM_MIN_SAMPLE_INTERVAL)
    monkeypatch.setattr(GpmSampler, "clock", lambda: now[0])
    taken = []
    sample_get = nvml.nvmlGpmSampleGet
    monkeypatch.setattr(nvml, "nvmlGpmSampleGet", lambda h, s: taken.append(now[0]) or sample_get(h, s))
    nvml.nvmlInit()
    s = GpmSampler(nvml.nvmlDeviceGetHandleByIndex(0))
    seen = []
    for t in (0.0, 0.05, 0.099, 0.1, 0.15, 0.25, 0.3):
        now[0] = 1000.0 + t
        out: dict[str, Any] = {}
        s.read(out, {})
        seen.append(out.get("gpm_sm_activity_ratio"))
        time.sleep(0.001)  # the stand-in's own timestamps must move between its samples
    assert [round(t - 1000.0, 3) for t in taken] == [0.0, 0.1, 0.25]
    assert seen[:3] == [None, None, None]  # one sample, then nothing to pair it with yet
    assert seen[3:] == pytest.approx([0.825] * 4)  # computed at 0.1 and 0.25, repeated in between
    s.close()


def test_the_unpacked_metric_layout_is_pynvmls() -> None:
    import ctypes

    import pynvml

    from gpuwatchd.sources.nvml.worker.gpm import _METRIC

    assert _METRIC.size == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
    assert pynvml.c_nvmlGpmMetric_t.value.offset == 8  # after metricId and nvmlReturn, as "@Iid" unpacks it
