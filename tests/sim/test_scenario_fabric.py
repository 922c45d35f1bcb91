"""The fabric scenarios (hgx-8gpu, fabric-gpu-unregistered, nvlink-down) through the stand-in, the real worker and
pynvml, the store and the rules: what each scenario's description says to expect."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.exporter.fabric_families import fabric_families
from gpuwatchd.model import GpuSample
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.sim.player import state_at
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.store import Store
from tests.sources.workerutil import run_worker, snap

StateWriter = Callable[[dict[str, Any]], Path]
T0 = 1_700_000_000.0


def _gpus(libdir: Path, write: StateWriter, name: str, t: float) -> tuple[GpuSample, ...]:
    code, lines, err = run_worker(libdir, write(state_at(load_scenario(name), t)), max_polls=1)
    assert code == 0, err
    return snap(lines[-1]).gpus


def test_hgx_8gpu_is_all_registered_and_every_pair_ok(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    gpus = _gpus(standin_libdir, write_sim_state, "hgx-8gpu", 0.0)
    assert [g.fabric_state for g in gpus] == [3] * 8
    assert {g.fabric_clique_id for g in gpus} == {32766}
    fam = {m.name: m for m in fabric_families(gpus)}["gpuwatchd_gpu_p2p_status"]
    assert len(fam.samples) == 8 * 7 * 3 and {s.value for s in fam.samples} == {0.0}
    assert all(sum(g.nvlink_states.values()) == 18 for g in gpus)


def test_fabric_gpu_unregistered_alerts_on_gpu6_only(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    store = Store()
    eng = RulesEngine(RulesConfig(), host="hgx")
    for t in (0.0, 130.0):
        code, lines, err = run_worker(standin_libdir, write_sim_state(
            state_at(load_scenario("fabric-gpu-unregistered"), t)), max_polls=1)
        assert code == 0, err
        store.apply(snap({**lines[-1], "timestamp": T0 + t}))
        alerts = [a for a in eng.evaluate(store, T0 + t) if a.name == "GpuFabricNotReady"]
    gpus = store.latest.gpus if store.latest else ()
    assert [g.fabric_state for g in gpus] == [3, 3, 3, 3, 3, 3, 1, 3]
    assert {u: c["nvlink"] for u, c in gpus[6].p2p_status.items()} == {g.uuid: 5 for g in gpus if g.index != 6}
    assert [(a.state, a.labels["gpu"]) for a in alerts] == [("firing", "6")]
    assert "has not started registering" in alerts[0].summary


def test_nvlink_down_takes_gpu2_links_and_nvlink_p2p(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    before = _gpus(standin_libdir, write_sim_state, "nvlink-down", 0.0)
    after = _gpus(standin_libdir, write_sim_state, "nvlink-down", 61.0)
    assert set(before[2].nvlink_states.values()) == {1}
    assert set(after[2].nvlink_states.values()) == {0} and len(after[2].nvlink_states) == 18
    assert {c["nvlink"] for c in after[2].p2p_status.values()} == {5}
    assert {c["read"] for c in after[2].p2p_status.values()} == {0}  # still P2P over PCIe
    assert [g.fabric_state for g in after] == [3] * 8
