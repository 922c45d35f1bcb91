"""Who holds the GPUs (sources/attribution): pods per GPU and the attribution sources' errors.

The per-process owner labels are on the process series (``gpu_families.process_families``)."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.sources.attribution.task import SOURCES
from gpuwatchd.store import Store

GPU_POD = spec(
    "gpuwatchd_gpu_pod_info", "info",
    "1 per Kubernetes pod container the kubelet gave the GPU or MIG instance (pod-resources List; "
    "nvidia.com/gpu and nvidia.com/mig-* devices; a GPU shared by time-slicing lists every pod).",
    ("uuid", "namespace", "pod", "container"),
)
ERRORS = spec(
    "gpuwatchd_attribution_errors_total", "counter",
    "Failures of an attribution source: cgroup (a GPU process' /proc/PID/cgroup unreadable, once per pid), "
    "kubernetes (pod-resources socket missing, slow or broken, or allocations skipped; per refresh), hpc_jobs "
    "(mapping directory unreadable or entries skipped; per refresh), runtime (a container runtime's state file "
    "unusable; once per container).",
    ("source",),
)


def attribution_families(store: Store) -> list[Metric]:
    a = store.attribution
    if a is None:
        return []
    f = Families()
    for p in a.pods:
        f.info(GPU_POD, {"uuid": p.uuid, "namespace": p.namespace, "pod": p.pod, "container": p.container})
    for source in SOURCES:
        f.add(ERRORS, (source,), a.errors.get(source, 0))
    return f.metrics()
