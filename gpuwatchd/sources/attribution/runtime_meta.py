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
with a size cap, non-blocking, regular files only (``small_files``); a value that is too long or holds control or
bidi characters is not used. An unreadable or unknown file means "not known", never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatchd.notify.json_body import check_depth
from gpuwatchd.sources.attribution.small_files import MAX_IMAGE_CHARS, MAX_NAME_CHARS, label_value, read_small

MAX_BYTES = 1 << 20  # an OCI config.json is tens of KB
MAX_DEPTH = 64  # an OCI config nests about 6 deep (linux.seccomp.syscalls[].args[])

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


class MetaFileError(Exception):
    """A runtime file that exists but cannot be used (not a regular file, too large, not JSON, too deep)."""


def _load(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None when there is no such file; MetaFileError when it is there but unusable."""
    try:
        raw = read_small(path, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None  # not this runtime's container (or gone, or the runtime keeps it from us): not known
    except OSError as e:
        raise MetaFileError(f"{path}: {e.strerror or type(e).__name__}") from None
    try:
        check_depth(raw, MAX_DEPTH)  # json.loads recurses: 1 MiB of '[' raised RecursionError out of the poll
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise MetaFileError(f"{path}: not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise MetaFileError(f"{path}: not a JSON object")
    return doc


def _str(d: Any, key: str, max_chars: int = MAX_NAME_CHARS) -> str | None:
    return label_value(d.get(key) if isinstance(d, dict) else None, max_chars)


def _oci(path: Path, ns_key: str, pod_key: str, ctr_key: str, image_key: str) -> ContainerMeta | None:
    doc = _load(path)
    if doc is None:
        return None
    ann = doc.get("annotations")
    if not isinstance(ann, dict):
        return None
    ctr = _str(ann, ctr_key)
    return ContainerMeta(name=ctr, image=_str(ann, image_key, MAX_IMAGE_CHARS), namespace=_str(ann, ns_key),
                         pod=_str(ann, pod_key), container=ctr)


def _docker(path: Path) -> ContainerMeta | None:
    doc = _load(path)
    if doc is None:
        return None
    cfg: dict[str, Any] = doc["Config"] if isinstance(doc.get("Config"), dict) else {}
    labels: dict[str, Any] = cfg["Labels"] if isinstance(cfg.get("Labels"), dict) else {}
    name = _str(doc, "Name")
    return ContainerMeta(name=name.lstrip("/") if name else None, image=_str(cfg, "Image", MAX_IMAGE_CHARS),
                         namespace=_str(labels, "io.kubernetes.pod.namespace"),
                         pod=_str(labels, "io.kubernetes.pod.name"),
                         container=_str(labels, "io.kubernetes.container.name"))


def read_meta(host_root: Path, runtime: str | None, container_id: str) -> tuple[ContainerMeta | None, str | None]:
    """What the runtime's files say of a container (full 64-hex id), or None when nothing readable names it; with
    the reason a file that is there could not be used (a FIFO, over 1 MiB, not JSON), else None."""
    if not all(c in "0123456789abcdef" for c in container_id) or len(container_id) != 64:
        return None, None
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
    problem = None
    for attempt in tries:
        try:
            meta = attempt()
        except MetaFileError as e:
            problem = problem or str(e)
            continue
        if meta is not None:
            return meta, problem
    return None, problem
