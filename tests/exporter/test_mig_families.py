"""MIG devices on /metrics: each a device under its own uuid, tied to its GPU by gpuwatchd_mig_device_info.

The exposition of a GPU in MIG mode is pinned in golden/metrics_mig.prom (regenerate with ``UPDATE_GOLDEN=1`` and
review the diff, like test_golden.py).
"""

from __future__ import annotations

import os

from prometheus_client import generate_latest

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.runtime_families import BuildInfo
from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.store import Store

from .conftest import GOLDEN, promtool_check, registry_for, samples
from .test_golden import normalise

PARENT = "GPU-5a3c1b2e-0000-4000-8000-000000000000"
GIB = 1 << 30


def mig_snapshot(t: float = 1_700_000_000.0, *, with_second: bool = True) -> Snapshot:
    gpu = GpuSample(uuid=PARENT, index=0, name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:07:00.0",
                    memory_total_bytes=80 * GIB, memory_used_bytes=25 * GIB, temperature_celsius=41.0,
                    power_watts=88.5, mig_mode_current=True)
    migs = [
        GpuSample(uuid="MIG-0d6a4c6b-1b57-5b8e-9a55-5d1a4cb1e0a1", index=0, name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                  memory_total_bytes=40 * GIB, memory_used_bytes=20 * GIB, memory_free_bytes=20 * GIB,
                  processes=(ProcessSample(4242, name="python", used_memory_bytes=19 * GIB),), processes_total=1,
                  parent_uuid=PARENT, gpu_instance_id=2, compute_instance_id=0, profile="3g.40gb"),
        GpuSample(uuid="MIG-7e0b1f93-6c2e-5d0a-8f3b-2a9c4d6e8f10", index=0, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                  memory_total_bytes=10 * GIB, memory_used_bytes=5 * GIB, memory_free_bytes=5 * GIB,
                  processes=(ProcessSample(4343, name="python", used_memory_bytes=4 * GIB),), processes_total=1,
                  parent_uuid=PARENT, gpu_instance_id=9, compute_instance_id=0, profile="1g.10gb"),
    ]
    return Snapshot(timestamp=t, nvml_ok=True, driver_version="535.54.03", device_count=1,
                    gpus=(gpu, *(migs if with_second else migs[:1])))


def test_mig_exposition_matches_golden() -> None:
    store = Store()
    store.apply(mig_snapshot())
    reg = registry_for(store, StoreCollector(store, build=BuildInfo.detect(), now=lambda: 1_700_000_003.0))
    got = normalise(generate_latest(reg).decode())
    if os.environ.get("UPDATE_GOLDEN") == "1":
        (GOLDEN / "metrics_mig.prom").write_text(got)
    assert got == (GOLDEN / "metrics_mig.prom").read_text(), "regenerate with UPDATE_GOLDEN=1 and review the diff"
    result = promtool_check(got.replace(" T\n", " 1700000000\n"))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_instances_are_devices_and_the_gpu_count_is_gpus() -> None:
    store = Store()
    store.apply(mig_snapshot())
    text = generate_latest(registry_for(store)).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(text)}
    mig = "MIG-7e0b1f93-6c2e-5d0a-8f3b-2a9c4d6e8f10"
    assert got[("gpuwatchd_mig_device_info", (("compute_instance_id", "0"), ("gpu_instance_id", "9"),
                                              ("parent_uuid", PARENT), ("profile", "1g.10gb"), ("uuid", mig)))] == 1
    assert got[("gpuwatchd_gpu_memory_used_bytes", (("uuid", mig),))] == 5 * GIB
    assert got[("gpuwatchd_gpu_process_memory_used_bytes", (("pid", "4343"), ("process", "python"), ("uuid", mig)))]
    assert got[("gpuwatchd_gpus", ())] == 1  # one GPU, two MIG devices
    assert ("gpuwatchd_gpu_temperature_celsius", (("uuid", mig),)) not in got
    assert got[("gpuwatchd_gpu_temperature_celsius", (("uuid", PARENT),))] == 41.0


def test_destroyed_instance_is_dropped_not_removed() -> None:
    store = Store()
    store.apply(mig_snapshot())
    store.apply(mig_snapshot(1_700_000_010.0, with_second=False))
    assert "MIG-7e0b1f93-6c2e-5d0a-8f3b-2a9c4d6e8f10" not in store.presence
    assert {p.state for p in store.presence.values()} == {"present"}
    text = generate_latest(registry_for(store)).decode()
    assert "MIG-7e0b1f93" not in text
