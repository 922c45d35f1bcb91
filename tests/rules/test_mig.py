"""Rules on a GPU in MIG mode: MIG devices are devices for the leak rule (GpuMemoryLeak names the MIG device's uuid,
with its parent_uuid) and not GPUs for presence (a destroyed MIG device is not a removed GPU, the count is GPUs)."""

from __future__ import annotations

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import GIB, MIB, T0, UUID, gpu, proc, run, snap, with_processes

MIG_A = "MIG-2f6c1d57-9a4e-5b3c-8d21-7e5f0a4b9c13"
MIG_B = "MIG-c4d19f3e-7b28-5a61-9e0f-5d3a8b6c2e70"


def named(alerts: list[Alert], name: str, state: str | None = None) -> list[Alert]:
    return [a for a in alerts if a.name == name and (state is None or a.state == state)]


def parent() -> object:
    return gpu(name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB, utilization_gpu_ratio=None,
               mig_mode_current=True)


def mig(uuid: str, profile: str, gi: int, total: int, procs: list[object]) -> object:
    g = gpu(uuid=uuid, name=f"NVIDIA A100-SXM4-80GB MIG {profile}", pci_bus_id=None, memory_total_bytes=total,
            utilization_gpu_ratio=None, temperature_celsius=None, power_watts=None, clocks_event_reasons=None,
            pcie_link_generation=None, pcie_link_max_generation=None, pcie_link_width=None,
            pcie_link_max_width=None, pcie_replay_total=None, temperature_slowdown_celsius=None,
            parent_uuid=UUID, gpu_instance_id=gi, compute_instance_id=0, profile=profile)
    return with_processes(g, procs, overhead=12 * MIB)  # type: ignore[arg-type]


def test_leak_in_one_mig_device_names_it(store: Store) -> None:
    eng = RulesEngine(RulesConfig(), host="node1")

    def make(t: float):  # type: ignore[no-untyped-def]
        s = t - T0
        steady = mig(MIG_A, "3g.40gb", 1, 40 * GIB, [proc(4101, 18 * GIB)])
        leaking = mig(MIG_B, "1g.10gb", 13, 9856 * MIB, [proc(4303, 1200 * MIB + min(s, 1380) * 6.2 * MIB)])
        return snap(t, parent(), steady, leaking)

    hist = run(store, eng, make, start=T0, end=T0 + 1500, every=30)
    fired = [a for _, al in hist for a in named(al, "GpuMemoryLeak", "firing") if a.labels.get("kind") == "gpu"]
    assert fired, "a MIG device's leak must raise GpuMemoryLeak"
    assert {(a.labels["uuid"], a.labels["pid"], a.labels["parent_uuid"], a.labels["gpu"]) for a in fired} == {
        (MIG_B, "4303", UUID, "0")}
    assert fired[0].summary.startswith("GPU 0 (NVIDIA A100-SXM4-80GB MIG 1g.10gb)")
    everything = {a.labels.get("uuid") for _, al in hist for a in al if a.state == "firing"}
    assert everything == {MIG_B}  # nothing for the GPU or the other MIG device


def test_destroyed_mig_device_is_not_a_removed_gpu_and_the_count_is_gpus(store: Store) -> None:
    eng = RulesEngine(validate(RulesConfig, {"expected_gpu_count": 1}), host="node1")
    a = mig(MIG_A, "3g.40gb", 1, 40 * GIB, [])
    b = mig(MIG_B, "1g.10gb", 13, 9856 * MIB, [])
    store.apply(snap(T0, parent(), a, b))
    assert eng.evaluate(store, T0) == []
    store.apply(snap(T0 + 5, parent(), a))  # the 1g.10gb destroyed (nvidia-smi mig -dci/-dgi)
    assert eng.evaluate(store, T0 + 5) == []
    assert eng.evaluate(store, T0 + 200) == []  # no GpuRemoved, no GpuCountLow
    assert MIG_B not in store.presence


def test_a_lost_gpu_alerts_once_not_per_mig_device(store: Store) -> None:
    from gpuwatchd.model import LostGpu

    eng = RulesEngine(RulesConfig(), host="node1")
    store.apply(snap(T0, parent(), mig(MIG_A, "3g.40gb", 1, 40 * GIB, [])))
    store.apply(snap(T0 + 5, lost=(LostGpu(index=0, uuid=UUID),)))
    lost = named(eng.evaluate(store, T0 + 5), "GpuLost")
    assert [(x.labels["uuid"], x.state) for x in lost] == [(UUID, "firing")]
    assert named(eng.evaluate(store, T0 + 5), "GpuRemoved") == []


def test_mig_device_labels_carry_the_parent(store: Store) -> None:
    from gpuwatchd.rules.condition import gpu_labels

    m = mig(MIG_A, "3g.40gb", 1, 40 * GIB, [])
    store.apply(snap(T0, parent(), m))
    assert gpu_labels(store, MIG_A) == {"uuid": MIG_A, "gpu": "0", "model": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                                        "parent_uuid": UUID}
    assert "parent_uuid" not in gpu_labels(store, UUID)
