"""``fleet``: every GPU busy, so probes are visibly skipped (counted with their reason) and none starts."""

from __future__ import annotations

from pathlib import Path

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sim.player import SCENARIO_EPOCH, state_at
from gpuwatchd.sim.probes import SimProbes
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.state import write_state
from gpuwatchd.store import Store

from .helpers import config


def _sample(i: int, dev: dict) -> GpuSample:  # type: ignore[type-arg]
    procs = dev.get("processes", {}).get("compute", [])
    return GpuSample(uuid=dev["uuid"], index=i, name=dev["name"], utilization_gpu_ratio=dev["utilization"]["gpu"] / 100,
                     processes=tuple(ProcessSample(pid=p["pid"]) for p in procs[:10]))


async def test_fleet_gpus_are_skipped_as_busy(tmp_path: Path) -> None:
    scen = load_scenario("fleet")
    clock = ManualClock(SCENARIO_EPOCH)
    store = Store()
    state_path = tmp_path / "state"
    svc = ProbeService(config(tmp_path), store, clock, tmp_path, sim=SimProbes(state_path))
    for t in range(0, 125, 5):
        clock.t = SCENARIO_EPOCH + t
        state = state_at(scen, t)
        write_state(state_path, state)
        store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True,
                             gpus=tuple(_sample(i, d) for i, d in enumerate(state["devices"]))))
        assert await svc.step() == []
    uuids = {d["uuid"] for d in state["devices"]}
    assert len(uuids) == 16
    assert {u for (u, reason) in store.probes.skipped if reason == "busy_process"} == uuids
    assert not store.probes.runs and not svc.own_pids
    assert {v.verdict for v in store.probes.verdicts.values()} == {"skipped (busy_process)"}
