"""The probe service on simulated GPUs (CPU device): scheduling gates, faults end to end, availability."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpuwatchd.exporter.probe_families import probe_families
from gpuwatchd.probes.baseline import Baselines
from gpuwatchd.probes.config import ProbesConfig
from gpuwatchd.probes.scheduler import Scheduler
from gpuwatchd.probes.service import _CHECKED
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.probe import conditions

from .helpers import UUID, config, feed, lose, service, sim_state


def _samples(store, name: str) -> dict[tuple[str, ...], float]:  # type: ignore[no-untyped-def]
    return {tuple(s.labels.values()): s.value for m in probe_families(store) for s in m.samples if s.name == name}


async def test_no_probe_starts_on_a_gpu_with_a_foreign_process(tmp_path: Path) -> None:
    svc, store, clock = service(tmp_path)
    feed(store, clock, 120, pids=(4242,))
    assert await svc.step() == []
    assert store.probes.skipped[(UUID, "busy_process")] == 1
    assert not store.probes.runs and not svc.own_pids
    feed(store, clock, 120, util=0.6)
    assert await svc.step() == []
    assert store.probes.skipped[(UUID, "busy_utilization")] == 1
    assert _samples(store, "gpuwatchd_probe_skipped_total") == {
        (UUID, "busy_process"): 1.0, (UUID, "busy_utilization"): 1.0}


async def test_not_before_idle_for_and_never_on_a_lost_gpu(tmp_path: Path) -> None:
    svc, store, clock = service(tmp_path)
    feed(store, clock, 10)  # watched for 10 s of the 60 s idle_for: not yet
    assert await svc.step() == []
    lose(store, clock)
    clock.advance(600)
    assert await svc.step() == []
    assert not store.probes.runs and not store.probes.skipped


async def test_healthy_runs_build_a_baseline_that_survives_a_restart(tmp_path: Path) -> None:
    svc, store, clock = service(tmp_path, baseline_runs=1)
    feed(store, clock, 120)
    first = await svc.step()
    assert {r.probe: r.result for r in first} == {"gemm": "pass", "memory": "pass", "pcie": "pass", "launch": "pass"}
    assert store.probes.verdicts[UUID].verdict == "pass (building baseline)"
    clock.advance(3600)
    feed(store, clock, 120)
    second = await svc.step()
    assert all(r.result == "pass" for r in second)
    assert store.probes.verdicts[UUID].verdict == "pass"
    ratios = _samples(store, "gpuwatchd_probe_baseline_ratio")
    assert ratios[(UUID, "pcie", "h2d")] == pytest.approx(1.0)
    bw = _samples(store, "gpuwatchd_probe_bandwidth_bytes_per_second")
    assert set(bw) == {(UUID, "d2d"), (UUID, "h2d"), (UUID, "d2h")} and all(v > 0 for v in bw.values())
    assert _samples(store, "gpuwatchd_probe_success")[(UUID, "gemm")] == 1.0
    again = Baselines(tmp_path / "state" / "probe-baselines.json", runs=1)  # a daemon restart
    assert again.baseline(UUID, "pcie.h2d") == svc.baselines.baseline(UUID, "pcie.h2d") is not None


async def test_sdc_and_slow_link_become_alerts(tmp_path: Path) -> None:
    svc, store, clock = service(tmp_path, {"gemm_flip": 1, "bandwidth_factor": 0.4}, baseline_runs=1)
    feed(store, clock, 120)
    await svc.step()
    conds = conditions(store, clock.now(), RulesConfig())
    failed = [c for c in conds if c.name == "GpuProbeFailed"]
    assert len(failed) == 1 and failed[0].labels["probe"] == "gemm"
    assert "gemm probe failed: 1 of 9,216 float32 elements differ from the float64 reference" in failed[0].summary
    # H2D at 0.4 of 0.9 of the link's expectation: degraded on this run, an alert only on the second in a row.
    assert not [c for c in conds if c.name == "GpuPerformanceDegraded"]
    clock.advance(3600)
    feed(store, clock, 120)
    await svc.step()
    slow = [c for c in conditions(store, clock.now(), RulesConfig()) if c.name == "GpuPerformanceDegraded"]
    assert [c.labels["probe"] for c in slow] == ["pcie"]
    assert "H2D 1.1 GB/s, 36% of what PCIe Gen3 x4 should give" in slow[0].summary
    assert _samples(store, "gpuwatchd_probe_errors")[(UUID, "gemm")] == 2.0  # one per dtype's worst count


async def test_hung_worker_is_killed_at_the_deadline_and_fails(tmp_path: Path) -> None:
    svc, store, clock = service(tmp_path, {"hang": True}, deadline="5s")
    feed(store, clock, 120)
    records = await svc.step()
    assert [(r.probe, r.result) for r in records] == [("worker", "timeout")]
    (cond,) = conditions(store, clock.now(), RulesConfig())
    assert cond.name == "GpuProbeFailed" and cond.labels["probe"] == "worker"
    assert "did not finish within its 5 s deadline and was killed" in cond.summary
    # The next run is fine (a generous deadline: a healthy run on a loaded machine may need many seconds).
    sim_state(tmp_path)
    svc.reconfigure(config(tmp_path, deadline="300s"))
    clock.advance(3600)
    feed(store, clock, 120)
    assert all(r.result == "pass" for r in await svc.step())
    assert conditions(store, clock.now(), RulesConfig()) == []


@pytest.mark.parametrize(("event", "reason"), [("job", "preempted"), ("lost", "gpu_lost")])
async def test_a_job_or_a_lost_gpu_mid_probe_cancels_it(tmp_path: Path, event: str, reason: str) -> None:
    svc, store, clock = service(tmp_path, {"hang": True}, deadline="300s")
    feed(store, clock, 120)
    task = asyncio.ensure_future(svc.step())
    for _ in range(400):
        if svc.own_pids:
            break
        await asyncio.sleep(0.05)
    if event == "job":
        feed(store, clock, 0, pids=(31337,))
    else:
        lose(store, clock)
    records = await asyncio.wait_for(task, 60)
    assert {r.result for r in records} == {"cancelled"}
    assert store.probes.skipped[(UUID, reason)] == 1
    assert conditions(store, clock.now(), RulesConfig()) == []


def test_duty_cycle_cap_is_enforced() -> None:
    from gpuwatchd.runtime.clock import ManualClock
    from gpuwatchd.store import Store

    from .helpers import feed as feed_store

    sched = Scheduler(ProbesConfig(interval=3600, idle_for=0, duty_cycle=0.01))
    store, clock = Store(), ManualClock()
    feed_store(store, clock, 10)
    now = clock.now()
    assert sched.decide(store, now, ()) == ([UUID], [])
    sched.started(UUID, now)
    sched.finished(UUID, now + 60)  # a 60 s run: the next may start 6000 s after this one began
    feed_store(store, clock, 3600)
    assert sched.decide(store, clock.now(), ()) == ([], [(UUID, "duty_cycle")])
    clock.advance(6000 - 3600)
    feed_store(store, clock, 10)
    assert sched.decide(store, clock.now(), ())[0] == [UUID]


async def test_torch_missing_is_reported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr("gpuwatchd.probes.service._CHECKED", {})
    svc, store, clock = service(tmp_path)
    feed(store, clock, 120)
    with caplog.at_level(logging.WARNING):
        assert await svc.step() == []
        clock.advance(7200)
        feed(store, clock, 120)
        await svc.step()
    assert caplog.text.count("torch health probes are off (torch_not_installed)") == 1
    assert "pip install 'gpuwatchd[probes]'" in caplog.text
    assert _samples(store, "gpuwatchd_probe_available") == {(): 0.0}
    assert _samples(store, "gpuwatchd_probe_unavailable_info") == {("torch_not_installed",): 1.0}
    assert store.probes.skipped[(UUID, "unavailable")] == 2


async def test_torch_without_cuda_is_found_by_a_worker_check(tmp_path: Path) -> None:
    from gpuwatchd.probes.service import ProbeService
    from gpuwatchd.runtime.clock import ManualClock
    from gpuwatchd.store import Store

    from .helpers import config

    _CHECKED.pop((__import__("sys").executable, "cuda"), None)
    store = Store()
    svc = ProbeService(config(tmp_path), store, ManualClock(), None)  # gpuwatchd run: the cuda device
    assert svc.device == "cuda" and svc.sim is None
    assert await svc.ensure_available() is False
    assert store.probes.unavailable_reason == "torch_without_cuda"  # this machine's torch is a CPU build


@pytest.mark.parametrize(
    ("crash", "result", "problem"),
    [("segfault", "crash", "crashed: killed by SIGSEGV (segmentation fault) after "),
     ("truncated", "crash", "printed a truncated result line"),
     ("oom", "oom", None)],
)
async def test_worker_crashes_fail_and_oom_is_a_skip(tmp_path: Path, crash: str, result: str,
                                                     problem: str | None) -> None:
    svc, store, clock = service(tmp_path, {"crash": crash}, deadline="300s")
    feed(store, clock, 120)
    records = await svc.step()
    conds = conditions(store, clock.now(), RulesConfig())
    if problem is None:  # the user's allocation won: counted as a skip, no alert, the other probes still ran
        assert {r.probe: r.result for r in records}["gemm"] == "oom"
        assert store.probes.skipped[(UUID, "oom")] == 1 and conds == []
        return
    assert [(r.probe, r.result) for r in records] == [("worker", result)]
    assert store.probes.runs[(UUID, "worker", result)] == 1
    (cond,) = conds
    assert cond.name == "GpuProbeFailed" and problem in cond.summary


async def test_a_missing_probe_interpreter_is_torch_not_installed(tmp_path: Path) -> None:
    from gpuwatchd.probes.service import ProbeService
    from gpuwatchd.runtime.clock import ManualClock
    from gpuwatchd.store import Store

    svc = ProbeService(config(tmp_path, python=str(tmp_path / "no-such-python")), Store(), ManualClock(), None)
    assert await svc.ensure_available() is False
    assert svc.ledger.unavailable_reason == "torch_not_installed"


def test_mig_devices_are_never_probed() -> None:
    """A MIG device shares its GPU's index; the scheduler and the probe API pick GPUs only."""
    from gpuwatchd.model import GpuSample, Snapshot
    from gpuwatchd.probes.api import select_gpus
    from gpuwatchd.store import Store

    gpu = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
    mig = GpuSample(uuid="MIG-2f6c1d57-9a4e-5b3c-8d21-7e5f0a4b9c13", index=0, parent_uuid=gpu, processes_total=0,
                    utilization_gpu_ratio=0.0)
    store = Store()
    store.apply(Snapshot(timestamp=1_700_000_000.0, nvml_ok=True,
                         gpus=(GpuSample(uuid=gpu, index=0, processes_total=0, utilization_gpu_ratio=0.0), mig)))
    due, _ = Scheduler(ProbesConfig(interval=3600, idle_for=0)).decide(store, 1_700_000_000.0, ())
    assert due == [gpu]
    assert [u for u, _, _ in select_gpus(store, [])] == [gpu]
    assert [u for u, _, _ in select_gpus(store, ["0"])] == [gpu]
