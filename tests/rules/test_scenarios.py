"""The shipped ``leak`` and ``plateau`` scenarios, sampled through the scenario player into a real Store: the
leak fires with a countdown to full, the plateau (warm-up + evaluation spikes) stays silent."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

player = pytest.importorskip("gpuwatchd.sim.player", reason="scenario player not available")
scenario_mod = pytest.importorskip("gpuwatchd.sim.scenario", reason="scenario loader not available")


def to_snapshot(state: dict[str, Any]) -> Snapshot:
    """The fields the leak rule reads, as the NVML worker would report them from this stand-in state."""
    gpus = []
    for i, d in enumerate(state["devices"]):
        mem = d["memory"]
        procs = tuple(
            ProcessSample(pid=p["pid"], used_memory_bytes=p.get("used_memory"), name=p.get("name"),
                          host_rss_bytes=p.get("host_rss"))
            for p in d.get("processes", {}).get("compute", [])
        )
        gpus.append(GpuSample(
            uuid=d["uuid"], index=i, name=d["name"],
            memory_total_bytes=mem["total"], memory_used_bytes=mem["used"] + mem.get("reserved", 0),
            memory_free_bytes=mem["total"] - mem["used"] - mem.get("reserved", 0),
            utilization_gpu_ratio=d["utilization"]["gpu"] / 100, processes=procs, processes_total=len(procs),
        ))
    return Snapshot(timestamp=state["clock"], nvml_ok=True, gpus=tuple(gpus))


def play(name: str, minutes: float) -> list[tuple[float, list[Any]]]:
    scen = scenario_mod.load_scenario(name)
    store = Store()
    engine = RulesEngine(RulesConfig(), host="sim")
    out = []
    for i in range(int(minutes * 60 / 5) + 1):
        t = i * 5.0
        snap = to_snapshot(player.state_at(scen, t))
        store.apply(snap)
        if i % 6 == 0:
            out.append((t, [a for a in engine.evaluate(store, snap.timestamp) if a.name == "GpuMemoryLeak"]))
    return out


def test_leak_scenario_fires_with_time_to_full() -> None:
    hist = play("leak", 26)
    fired = [(t, a) for t, al in hist for a in al if a.state == "firing" and a.labels.get("kind") == "gpu"]
    assert fired, "the leak scenario must raise GpuMemoryLeak"
    t, a = fired[0]
    assert t <= 20 * 60 and a.labels["pid"] == "4242" and a.labels["process"] == "python"
    # ~11.4 MiB/s; at detection the GPU is full at the end of the 30 min ramp (t ~ 1810 s), give or take
    assert a.value is not None and abs((t + a.value) - 1810) < 240
    etas = [a.value for _, a in fired]
    assert etas == sorted(etas, reverse=True)  # counts down


def test_plateau_scenario_is_silent() -> None:
    hist = play("plateau", 40)
    assert [a for _, al in hist for a in al] == []
