"""Hand-made snapshots for the rules tests: the GPU is the only thing faked; the Store is the real one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

MIB = 1024**2
GIB = 1024**3
T0 = 1_700_000_000.0
UUID = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
# ../shared beside the checkout, as on every developer machine and in CI (never copied into the repo)
CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "captures"


def gpu(uuid: str = UUID, index: int = 0, **kw: object) -> GpuSample:
    """An A10G-like GPU sample; keyword arguments override fields."""
    base = GpuSample(
        uuid=uuid,
        index=index,
        name="NVIDIA A10G",
        pci_bus_id=f"00000000:{0x0C + index:02X}:00.0",
        memory_total_bytes=24 * GIB,
        memory_used_bytes=1 * GIB,
        memory_free_bytes=23 * GIB,
        utilization_gpu_ratio=0.9,
        temperature_celsius=60.0,
        temperature_slowdown_celsius=95.0,
        power_watts=150.0,
        clocks_event_reasons=0,
        pcie_link_generation=4,
        pcie_link_max_generation=4,
        pcie_link_width=16,
        pcie_link_max_width=16,
        pcie_replay_total=0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def with_processes(g: GpuSample, procs: Iterable[ProcessSample], overhead: int = 300 * MIB) -> GpuSample:
    """Set processes and make used/free consistent with them (plus a fixed driver overhead)."""
    procs = tuple(procs)
    used = overhead + sum(p.used_memory_bytes or 0 for p in procs)
    total = g.memory_total_bytes or 0
    return replace(
        g, processes=procs, processes_total=len(procs), memory_used_bytes=used, memory_free_bytes=total - used
    )


def proc(pid: int, used: float, *, name: str = "python", rss: float | None = None) -> ProcessSample:
    return ProcessSample(
        pid=pid, used_memory_bytes=int(used), name=name, user="alice",
        host_rss_bytes=None if rss is None else int(rss),
    )


def snap(t: float, *gpus: GpuSample, **kw: object) -> Snapshot:
    return Snapshot(timestamp=t, nvml_ok=True, gpus=tuple(gpus), **kw)  # type: ignore[arg-type]


def run(
    store: Store,
    engine: RulesEngine,
    make: Callable[[float], Snapshot],
    *,
    start: float,
    end: float,
    step: float = 5.0,
    every: float = 30.0,
) -> list[tuple[float, list]]:  # type: ignore[type-arg]
    """Apply ``make(t)`` every ``step`` s and evaluate every ``every`` s; returns (t, alerts) per evaluation."""
    out = []
    t = start
    next_eval = start
    while t <= end + 1e-9:
        store.apply(make(t))
        if t >= next_eval - 1e-9:
            out.append((t, engine.evaluate(store, t)))
            next_eval += every
        t += step
    return out


@pytest.fixture
def store() -> Store:
    return Store(retention_seconds=3600.0, step_seconds=5.0)


@pytest.fixture
def config() -> RulesConfig:
    return RulesConfig()


@pytest.fixture
def engine(config: RulesConfig) -> RulesEngine:
    return RulesEngine(config, host="node1")
