"""Kubernetes pods holding GPUs, from the kubelet's pod-resources API (``v1.PodResourcesLister/List``).

The kubelet serves it on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``). Like dcgm-exporter
(``internal/pkg/transformation/kubernetes.go``) only devices of resource ``nvidia.com/gpu`` or ``nvidia.com/mig-*``
are kept; their ids are GPU or MIG UUIDs. Under the device plugin's time-slicing a replica id is ``<UUID>::<n>``:
the suffix is dropped, so every pod sharing the GPU is listed for it.

The call is blocking gRPC with a deadline, run off the event loop by the caller; grpc is imported on the first
call only (it costs several MB of memory, and a host without Kubernetes never pays it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatchd.model import GpuPod
from gpuwatchd.sources.attribution.small_files import label_value

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"  # k8s-device-plugin time-slicing / MPS replica ids: "<uuid>::<replica>"
MAX_MESSAGE_BYTES = 16 << 20  # the kubelet's own limit for this API (podresources.DefaultPodResourcesMaxSize)
MAX_GPU_PODS = 1024  # (GPU, pod container) pairs kept: 64 GPUs x 16 time-slicing replicas
MAX_UUID_CHARS = 128  # "GPU-<uuid>" is 40, the old "MIG-GPU-<uuid>/<gi>/<ci>" about 60
MAX_NAMESPACE_CHARS = 63  # namespaces and container names are DNS labels; pod names DNS subdomains (253)


class PodResourcesError(Exception):
    """List failed: ``reason`` is a short word for the log and the metric (unavailable, deadline, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def device_uuid(device_id: str) -> str:
    """A device id as the kubelet lists it -> the GPU/MIG UUID NVML reports."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


@dataclass(frozen=True, slots=True)
class GpuPods:
    """The kubelet's GPU allocations, and how many were skipped (past :data:`MAX_GPU_PODS`, or a name no
    Kubernetes object can have) with the first reason."""

    pods: tuple[GpuPod, ...]
    skipped: int = 0
    first_problem: str | None = None


def gpu_pods(response: Any) -> GpuPods:
    """``ListPodResourcesResponse`` -> one :class:`GpuPod` per (GPU uuid, pod container), sorted, no duplicates.

    Each becomes a ``gpuwatchd_gpu_pod_info`` series and the names become labels: names longer than Kubernetes
    allows, or with control or bidi characters, are skipped, and at most :data:`MAX_GPU_PODS` are kept (a kubelet
    answering 100k pods must not become 100k series)."""
    out: set[GpuPod] = set()
    skipped = 0
    problem: str | None = None
    for pod in response.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if not is_gpu_resource(dev.resource_name):
                    continue
                for did in dev.device_ids:
                    uuid = device_uuid(did)
                    if not uuid:
                        continue
                    names = (label_value(uuid, MAX_UUID_CHARS), label_value(pod.namespace, MAX_NAMESPACE_CHARS),
                             label_value(pod.name), label_value(c.name, MAX_NAMESPACE_CHARS))
                    if None in names:
                        skipped += 1
                        problem = problem or "a device, namespace, pod or container name Kubernetes does not allow"
                        continue
                    gp = GpuPod(*names)  # type: ignore[arg-type]
                    if gp not in out and len(out) >= MAX_GPU_PODS:
                        skipped += 1
                        problem = problem or f"more than {MAX_GPU_PODS} GPU allocations"
                        continue
                    out.add(gp)
    pods = tuple(sorted(out, key=lambda p: (p.uuid, p.namespace, p.pod, p.container)))
    return GpuPods(pods, skipped, problem)


def list_gpu_pods(socket: Path, timeout: float) -> GpuPods:
    """Ask the kubelet once (blocking, at most ``timeout`` seconds); raises :class:`PodResourcesError`."""
    import grpc

    from gpuwatchd.sources.attribution.podresources import api_pb2, api_pb2_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.enable_retries", 0)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        name = code.name.lower() if code is not None else "error"
        detail = e.details() if hasattr(e, "details") else str(e)
        raise PodResourcesError(name, f"{socket}: {detail}") from None
    return gpu_pods(response)
