"""The container (or Slurm job) a process runs in, from the text of ``/proc/PID/cgroup``.

The file has one line per hierarchy, ``ID:CONTROLLERS:PATH`` (cgroups(7)); cgroup v2 has the single line
``0::PATH``. The runtimes name their cgroups in documented shapes:

- Docker: ``docker-<64 hex>.scope`` under ``system.slice`` with the systemd cgroup driver, ``/docker/<64 hex>``
  with the cgroupfs driver (dockerd ``--exec-opt native.cgroupdriver``, "Configure the cgroup driver").
- containerd/CRI under the kubelet: ``kubepods[-<qos>].slice/kubepods-<qos>-pod<uid, '-' as '_'>.slice/
  cri-containerd-<64 hex>.scope`` (systemd driver) or ``/kubepods/<qos>/pod<uid>/<64 hex>`` (cgroupfs).
- CRI-O: ``crio-<64 hex>.scope`` (``crio-conmon-<id>.scope`` is its monitor, not the container).
- Podman: ``libpod-<64 hex>.scope`` (``libpod-conmon-...`` is the monitor; rootless under ``user@UID.service``;
  cgroup v2 adds a ``container`` leaf when the container runs its own init), ``/libpod_parent/libpod-<64 hex>``
  with cgroupfs.
- nerdctl (containerd without Kubernetes): ``nerdctl-<64 hex>.scope``.
- systemd-nspawn/machined: ``machine.slice/machine-<name>.scope`` (systemd.special(7)).
- Slurm: ``.../job_<id>/step_<step>/...`` (cgroup v1 ``/slurm/uid_<uid>/job_<id>/...``, cgroup v2 under
  ``slurmstepd.scope``).

A path that matches none of them is a host process: no container, never a guess.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpuwatchd.sources.attribution.small_files import read_small

SHORT_ID = 12  # `docker ps` and `crictl ps` show this many hex digits

_HEX64 = r"[0-9a-f]{64}"
# (runtime, pattern of one path component that is the container's own cgroup)
_SCOPES = (
    ("docker", re.compile(rf"docker-({_HEX64})\.scope")),
    ("containerd", re.compile(rf"cri-containerd-({_HEX64})\.scope")),
    ("cri-o", re.compile(rf"crio-({_HEX64})\.scope")),
    ("podman", re.compile(rf"libpod-({_HEX64})\.scope")),
    ("podman", re.compile(rf"libpod-({_HEX64})")),  # cgroupfs driver: /libpod_parent/libpod-<id>
    ("nerdctl", re.compile(rf"nerdctl-({_HEX64})\.scope")),
)
_BARE = re.compile(_HEX64)  # cgroupfs drivers: the component is the id itself (/docker/<id>, /kubepods/.../<id>)
_POD = re.compile(r"(?:kubepods-(?:besteffort-|burstable-)?)?pod([0-9a-f_-]{36})(?:\.slice)?")
_MACHINE = re.compile(r"machine-(.+)\.scope")
# machined's names are host names (hostname_is_valid): ASCII letters, digits, '-', '_', '.', at most 64
_MACHINE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SLURM_JOB = re.compile(r"job_([0-9]{1,20})")  # ASCII only: \d would take Arabic-Indic or fullwidth digits
# A real /proc/PID/cgroup is one line per hierarchy (a dozen at most under v1), each path at most PATH_MAX.
MAX_CGROUP_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a cgroup path says about its process; all None for a host process."""

    container_id: str | None = None  # full 64 hex (or the machine name of an nspawn container)
    runtime: str | None = None
    pod_uid: str | None = None  # Kubernetes pod UID (with dashes) when the cgroup is under kubepods
    hpc_job: str | None = None

    @property
    def short_id(self) -> str | None:
        if self.container_id is None:
            return None
        return self.container_id[:SHORT_ID] if _BARE.fullmatch(self.container_id) else self.container_id


HOST = CgroupOwner()


def paths(text: str) -> list[str]:
    """The cgroup paths of a /proc/PID/cgroup text, the v2 (unified) one first; malformed lines are skipped."""
    unified: list[str] = []
    legacy: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        (unified if parts[0] == "0" and parts[1] == "" else legacy).append(parts[2])
    return unified + legacy


def parse_path(path: str) -> CgroupOwner:
    """The owner named by one cgroup path."""
    parts = [p for p in path.split("/") if p]
    container_id = runtime = pod_uid = job = None
    kube = False
    for i, part in enumerate(parts):
        if part.startswith("kubepods"):
            kube = True
        m = _POD.fullmatch(part)
        if m is not None and (kube or i > 0):
            pod_uid = m.group(1).replace("_", "-")
            continue
        m = _SLURM_JOB.fullmatch(part)
        if m is not None:
            job = m.group(1)
            continue
        if part.startswith(("libpod-conmon-", "crio-conmon-")):
            return HOST  # the runtime's monitor process, not the container's
        for rt, pat in _SCOPES:
            m = pat.fullmatch(part)
            if m is not None:
                container_id, runtime = m.group(1), rt
                break
        else:
            if _BARE.fullmatch(part) and i > 0:
                parent = parts[i - 1]
                container_id = part
                runtime = "docker" if parent == "docker" else "kubernetes" if kube else parent
            elif (m := _MACHINE.fullmatch(part)) is not None and i > 0 and parts[i - 1] == "machine.slice":
                name = _unescape(m.group(1))
                if _MACHINE_NAME.fullmatch(name) is None:
                    return HOST  # not a name machined gives (control characters, quotes, 200 bytes): no guess
                container_id, runtime = name, "systemd-nspawn"
    if kube and container_id is not None and runtime in ("kubernetes", "kubepods"):
        runtime = "kubernetes"
    if container_id is None and pod_uid is None and job is None:
        return HOST
    return CgroupOwner(container_id, runtime, pod_uid if kube else None, job)


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> CgroupOwner:
    """The owner of a process from its whole /proc/PID/cgroup text (first path that names one wins). Memoized:
    the processes of one container or session share the text, and each is re-read every 30 s."""
    for p in paths(text):
        owner = parse_path(p)
        if owner is not HOST:
            return owner
    return HOST


def read(proc_root: Path, pid: int) -> CgroupOwner | None:
    """Read and parse ``<proc_root>/<pid>/cgroup``; None when it cannot be read (gone, another pid namespace)."""
    try:
        return read_checked(proc_root, pid)
    except OSError:
        return None


def read_checked(proc_root: Path, pid: int) -> CgroupOwner:
    """Read and parse ``<proc_root>/<pid>/cgroup``; OSError when it cannot be read, is not a regular file (a FIFO
    in a fake tree would block the event loop) or is over :data:`MAX_CGROUP_BYTES`."""
    # a string path, not pathlib's joins: at 16 x 256 this runs ~140 times a second (the spread re-reads)
    raw = read_small(f"{os.fspath(proc_root)}/{pid}/cgroup", MAX_CGROUP_BYTES)
    return parse(raw.decode("utf-8", errors="replace"))


def _unescape(name: str) -> str:
    """systemd unit-name escaping (``\\x2d`` for '-') undone, as ``systemd-escape --unescape`` does."""
    return re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), name)
