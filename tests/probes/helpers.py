"""A store with simulated GPUs in it, and a probe service over it (sim mode: the CPU device)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwatchd.config.loader import Config, config_from_dict
from gpuwatchd.model import GpuSample, LostGpu, ProcessSample, Snapshot
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sim.probes import SimProbes
from gpuwatchd.sim.state import make_state, write_state
from gpuwatchd.store import Store

UUID = "GPU-11111111-2222-3333-4444-555555555555"
T0 = 1_700_000_000.0


def gpu(util: float = 0.0, pids: tuple[int, ...] = (), uuid: str = UUID, index: int = 0) -> GpuSample:
    return GpuSample(
        uuid=uuid, index=index, name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:06:00.0",
        utilization_gpu_ratio=util, pcie_link_generation=3, pcie_link_max_generation=3, pcie_link_width=4,
        pcie_link_max_width=4, processes=tuple(ProcessSample(pid=p, used_memory_bytes=1 << 30) for p in pids),
    )


def feed(store: Store, clock: ManualClock, seconds: float, **kw: Any) -> None:
    """Snapshots every 5 s for ``seconds`` of clock time, then one at the end."""
    end = clock.now() + seconds
    while clock.now() < end:
        store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(gpu(**kw),)))
        clock.advance(5.0)
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(gpu(**kw),)))


def lose(store: Store, clock: ManualClock) -> None:
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, lost=(LostGpu(index=0, uuid=UUID),)))


def config(tmp: Path, **probes: Any) -> Config:
    return config_from_dict({"state_dir": str(tmp / "state"), "sysfs": {"root": str(tmp / "sysfs")},
                             "probes": {"idle_for": "60s", "baseline_runs": 2, "duty_cycle": 1.0, **probes}})


def sim_state(tmp: Path, faults: dict[str, Any] | None = None) -> Path:
    state = make_state(1)
    state["devices"][0]["uuid"] = UUID
    if faults:
        state["devices"][0]["_probe"] = faults
    path = tmp / "standin-state"
    write_state(path, state)
    return path


def service(tmp: Path, faults: dict[str, Any] | None = None, **probes: Any) -> tuple[ProbeService, Store, ManualClock]:
    clock = ManualClock(T0)
    store = Store()
    (tmp / "state").mkdir(exist_ok=True)
    svc = ProbeService(config(tmp, **probes), store, clock, tmp / "state", sim=SimProbes(sim_state(tmp, faults)))
    return svc, store, clock
