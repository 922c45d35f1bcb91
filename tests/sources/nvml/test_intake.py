"""The daemon's intake of snapshot lines (sources/nvml/intake.py): MIG devices share their GPU's index, so they never
stand for the GPU at that index when a later worker reports it lost unnamed."""

from __future__ import annotations

from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sources.nvml.intake import SnapshotIntake

GPU = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
MIG = "MIG-2f6c1d57-9a4e-5b3c-8d21-7e5f0a4b9c13"


def test_a_gpu_lost_unnamed_is_named_from_its_gpu_not_its_mig_device() -> None:
    intake = SnapshotIntake(ManualClock())
    intake.receive({"nvml_ok": True, "gpus": [
        {"uuid": GPU, "index": 0, "pci_bus_id": "00000000:07:00.0"},
        {"uuid": MIG, "index": 0, "pci_bus_id": None, "parent_uuid": GPU, "gpu_instance_id": 1}]})
    assert intake.known == {0: (GPU, "00000000:07:00.0")}
    snap = intake.receive({"nvml_ok": True, "lost": [{"index": 0, "reason": "gpu_is_lost"}]})
    assert [(x.uuid, x.pci_bus_id) for x in snap.lost] == [(GPU, "00000000:07:00.0")]
