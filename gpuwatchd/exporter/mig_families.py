"""MIG devices: what ties a MIG device's series (labelled with its own ``MIG-...`` uuid) to its GPU.

A MIG device is exported like a GPU, under its own uuid, with the readings a MIG device has (memory, processes;
docs/metrics.md). This info family carries what only a MIG device has: the GPU it is part of (``parent_uuid``),
its GPU instance and compute instance ids, and its profile (``1g.10gb``); join on uuid, e.g.
``gpuwatchd_gpu_memory_used_bytes * on(uuid) group_left(parent_uuid, profile) gpuwatchd_mig_device_info``.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, label, spec
from gpuwatchd.model import GpuSample

MIG_DEVICE_INFO = spec(
    "gpuwatchd_mig_device_info", "info",
    "A MIG device (a compute instance of a GPU in MIG mode), exported as a device of its own under its MIG-... uuid:"
    " the GPU it is part of, its GPU instance and compute instance ids, and its profile (e.g. 1g.10gb).",
    ("uuid", "parent_uuid", "gpu_instance_id", "compute_instance_id", "profile"),
)


def mig_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """One info sample per present MIG device."""
    f = Families()
    for g in gpus:
        if g.parent_uuid is None:
            continue
        f.info(MIG_DEVICE_INFO, {"uuid": g.uuid, "parent_uuid": g.parent_uuid,
                                 "gpu_instance_id": label(g.gpu_instance_id),
                                 "compute_instance_id": label(g.compute_instance_id), "profile": label(g.profile)})
    return f.metrics()
