"""The ``attribution`` config section: who holds a GPU (docs/kubernetes.md, docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from gpuwatchd.config.types import PositiveDuration, SafePath, Section

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class KubernetesAttributionConfig(Section, frozen=True):
    """Pods from the kubelet's pod-resources API (gRPC ``v1.PodResourcesLister/List`` on a unix socket)."""

    # The kubelet's socket. Used only when it exists (a host without Kubernetes pays nothing); set in the file
    # (even to the default), a missing socket counts in gpuwatchd_attribution_errors_total{source="kubernetes"}
    # and is logged once.
    pod_resources_socket: SafePath = DEFAULT_POD_RESOURCES_SOCKET
    # How often the kubelet is asked (never per scrape): a replaced pod's labels follow within this long.
    interval: PositiveDuration = 10.0
    # A List call that takes longer than this is abandoned and counted as an error (a hung kubelet never stalls
    # the daemon).
    timeout: Annotated[PositiveDuration, msgspec.Meta(le=60.0)] = 2.0


class AttributionConfig(Section, frozen=True):
    """Containers (from /proc/PID/cgroup), Kubernetes pods and HPC jobs of GPU processes (applied at start; a
    reload that changes it says a restart is needed)."""

    # Attribute processes at all. Off: per-process series carry pid and name only.
    enabled: bool = True
    kubernetes: KubernetesAttributionConfig = KubernetesAttributionConfig()
    # dcgm-exporter's --hpc-job-mapping-dir format: one file per GPU index holding job ids, one per line. Unset: off
    # (a process in a Slurm job cgroup still gets its job from the cgroup).
    hpc_job_mapping_dir: SafePath | None = None
    # Where /proc/PID/cgroup is read (`gpuwatchd sim` points it at a fake tree). In a container the daemon needs
    # the host's PID namespace (hostPID) for this to see GPU processes.
    proc_root: SafePath = Path("/proc")
    # Prefix of the container runtimes' state files (containerd bundles under /run/containerd, CRI-O under
    # /run/containers, Docker under /var/lib/docker) read for a container's name, image and pod.
    host_root: SafePath = Path("/")
