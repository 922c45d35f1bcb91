"""A container's name, image and Kubernetes pod from the runtime's own files, without a call to its daemon.

- containerd (CRI): the OCI bundle ``/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json``
  carries the CRI annotations ``io.kubernetes.cri.sandbox-namespace``, ``io.kubernetes.cri.sandbox-name``,
  ``io.kubernetes.cri.container-name`` and ``io.kubernetes.cri.image-name`` (containerd's
  ``pkg/cri/annotations``).
- CRI-O: ``/run/containers/storage/overlay-containers/<id>/userdata/config.json``, annotations
  ``io.kubernetes.pod.namespace``, ``io.kubernetes.pod.name``, ``io.kubernetes.container.name``.
- Docker: ``/var/lib/docker/containers/<id>/config.v2.json`` (``Name``, ``Config.Image``; cri-dockerd adds the
  ``io.kubernetes.*`` labels).

This is what names the pod of a process on a GPU that several pods share (time-slicing, MPS): the kubelet's
pod-resources answer lists every pod for the GPU, the process' container says which one it is. Files are read
with a size cap; an unreadable or unknown file means "not known", never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 20  # an OCI config.json is tens of KB

CONTAINERD_BUNDLES = "run/containerd/io.containerd.runtime.v2.task/k8s.io"
CRIO_CONTAINERS = "run/containers/storage/overlay-containers"
DOCKER_CONTAINERS = "var/lib/docker/containers"


@dataclass(frozen=True, slots=True)
class ContainerMeta:
    name: str | None = None
    image: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _str(d: Any, key: str) -> str | None:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, str) and v and v.isprintable() else None


def _oci(path: Path, ns_key: str, pod_key: str, ctr_key: str, image_key: str) -> ContainerMeta | None:
    doc = _load(path)
    if doc is None:
        return None
    ann = doc.get("annotations")
    if not isinstance(ann, dict):
        return None
    ctr = _str(ann, ctr_key)
    return ContainerMeta(name=ctr, image=_str(ann, image_key), namespace=_str(ann, ns_key),
                         pod=_str(ann, pod_key), container=ctr)


def _docker(path: Path) -> ContainerMeta | None:
    doc = _load(path)
    if doc is None:
        return None
    cfg: dict[str, Any] = doc["Config"] if isinstance(doc.get("Config"), dict) else {}
    labels: dict[str, Any] = cfg["Labels"] if isinstance(cfg.get("Labels"), dict) else {}
    name = _str(doc, "Name")
    return ContainerMeta(name=name.lstrip("/") if name else None, image=_str(cfg, "Image"),
                         namespace=_str(labels, "io.kubernetes.pod.namespace"),
                         pod=_str(labels, "io.kubernetes.pod.name"),
                         container=_str(labels, "io.kubernetes.container.name"))


def read_meta(host_root: Path, runtime: str | None, container_id: str) -> ContainerMeta | None:
    """What the runtime's files say of a container (full 64-hex id), or None when nothing readable names it."""
    if not all(c in "0123456789abcdef" for c in container_id) or len(container_id) != 64:
        return None
    tries: list[Callable[[], ContainerMeta | None]] = []
    if runtime in ("containerd", "kubernetes"):
        tries.append(lambda: _oci(host_root / CONTAINERD_BUNDLES / container_id / "config.json",
                                  "io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
                                  "io.kubernetes.cri.container-name", "io.kubernetes.cri.image-name"))
    if runtime in ("cri-o", "kubernetes"):
        tries.append(lambda: _oci(host_root / CRIO_CONTAINERS / container_id / "userdata" / "config.json",
                                  "io.kubernetes.pod.namespace", "io.kubernetes.pod.name",
                                  "io.kubernetes.container.name", "io.kubernetes.cri-o.ImageName"))
    if runtime in ("docker", "kubernetes"):
        tries.append(lambda: _docker(host_root / DOCKER_CONTAINERS / container_id / "config.v2.json"))
    for attempt in tries:
        meta = attempt()
        if meta is not None:
            return meta
    return None
