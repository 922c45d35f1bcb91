"""Allocator reports in the store: through the one door, kept while the process is listed on its GPU, bounded;
and exported only for processes among the GPU's per-process series."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.training_families import training_families
from gpuwatchd.model.training import TorchOom, TorchReport, TrainingSocketStatus
from gpuwatchd.store import Store
from gpuwatchd.store.training import MAX_REPORTS
from tests.store.test_store import T0, gpu, snap


def samples(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics for s in m.samples}


def test_reports_live_as_long_as_their_process_is_listed() -> None:
    s = Store()
    s.apply(snap(T0, gpu(procs={10: 1 << 30, 11: 1 << 30})))
    v = s.version
    assert s.ingest(TorchReport("GPU-a", 10, T0, allocated_bytes=5, oom=TorchOom(T0, 7)))
    assert s.ingest(TorchReport("GPU-a", 11, T0, allocated_bytes=6))
    assert s.version == v + 2
    assert s.training.last_oom[("GPU-a", 10)].requested_bytes == 7
    s.apply(snap(T0 + 1, gpu(procs={11: 1 << 30})))  # pid 10 left the GPU
    assert set(s.training.reports) == {("GPU-a", 11)} and not s.training.last_oom
    s.apply(snap(T0 + 2, ok=False))  # NVML down: nothing known, nothing forgotten
    assert set(s.training.reports) == {("GPU-a", 11)}


def test_the_ledger_is_bounded() -> None:
    s = Store()
    for pid in range(MAX_REPORTS):
        assert s.ingest(TorchReport("GPU-a", pid + 1, T0))
    assert not s.ingest(TorchReport("GPU-a", MAX_REPORTS + 1, T0))
    assert s.ingest(TorchReport("GPU-a", 1, T0 + 1, ooms=1))  # a known process still updates
    assert len(s.training.reports) == MAX_REPORTS


def test_an_unchanged_socket_status_does_not_bump_the_version() -> None:
    s = Store()
    st = TrainingSocketStatus(True, "/run/gpuwatchd/training.sock", None, 1, {"accepted": 1}, {"accepted": 3})
    assert s.ingest(st)
    assert not s.ingest(TrainingSocketStatus(True, "/run/gpuwatchd/training.sock", None, 1, {"accepted": 1},
                                             {"accepted": 3}))


def test_only_processes_in_the_gpu_s_series_are_exported() -> None:
    s = Store()
    g = gpu(procs={10: 1 << 30})
    s.apply(snap(T0, g))
    s.ingest(TorchReport("GPU-a", 10, T0, allocated_bytes=5, reserved_bytes=8, inactive_split_bytes=1,
                         alloc_retries=2, ooms=0, input_wait_ratio=0.5))
    s.ingest(TorchReport("GPU-a", 99, T0, allocated_bytes=5))  # not among the GPU's listed processes
    out = samples(training_families([g], s.training, None))
    lab = (("pid", "10"), ("process", ""), ("uuid", "GPU-a"))
    assert out == {("gpuwatchd_process_torch_allocated_bytes", lab): 5.0,
                   ("gpuwatchd_process_torch_reserved_bytes", lab): 8.0,
                   ("gpuwatchd_process_torch_inactive_split_bytes", lab): 1.0,
                   ("gpuwatchd_process_torch_alloc_retries_total", lab): 2.0,
                   ("gpuwatchd_process_torch_ooms_total", lab): 0.0,
                   ("gpuwatchd_process_torch_input_wait_ratio", lab): 0.5}
    s.ingest(TorchReport("GPU-a", 10, T0 + 1))  # a client whose torch reports nothing: no sample, never 0
    assert samples(training_families([g], s.training, None)) == {}
