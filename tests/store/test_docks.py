"""The store keeps the docks attached now and, per GPU, the dock it was last seen behind (for GpuRemoved)."""

from __future__ import annotations

from gpuwatchd.model import DockSample, GpuSample, Snapshot
from gpuwatchd.store import Store

DOCK = DockSample(unique_id="uid-1", route="0-1", domain="domain0", authorized=True, name="Core X",
                  gpu_bus_ids=("0000:0c:00.0",))


def test_dock_is_remembered_for_its_gpu_after_both_are_gone() -> None:
    store = Store()
    store.apply(Snapshot(1.0, True, gpus=(GpuSample("GPU-a", 0, pci_bus_id="00000000:0C:00.0"),
                                          GpuSample("GPU-b", 1, pci_bus_id="00000000:41:00.0"))))
    v = store.version
    store.set_docks([DOCK])
    assert store.version > v
    assert store.docks == (DOCK,)
    assert store.dock_gpu_uuids(DOCK) == ["GPU-a"]
    assert store.gpu_docks == {"GPU-a": DOCK}
    store.apply(Snapshot(2.0, True, gpus=(GpuSample("GPU-b", 0, pci_bus_id="00000000:41:00.0"),)))
    store.set_docks([])
    assert store.docks == ()
    assert store.presence["GPU-a"].state == "removed"
    assert store.gpu_docks == {"GPU-a": DOCK}
    assert store.dock_gpu_uuids(DOCK) == []
