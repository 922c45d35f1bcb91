"""The rest of a simulated host that ``gpuwatchd doctor`` looks at, under the same root as the fake sysfs:
``proc/driver/nvidia/version`` and ``sys/module/nvidia/version`` (the loaded kernel module), ``/dev/nvidia*``
nodes (plain files, mode 0666 as the driver's default NVreg_DeviceFileMode makes them), and the manifest that
points ``gpuwatchd doctor --sim DIR`` at a running ``gpuwatchd sim``.

State keys (Python-only, docs/sim-state.md): ``kernel_module_version`` (default: ``driver_version``; null: the
module is not loaded), ``torch`` (what the simulated host's torch reports, for doctor's CUDA checks).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "sim-host.json"
TORCH_KEYS = {"installed", "version", "cuda", "available", "device_count"}


def kernel_module(state: dict[str, Any]) -> str | None:
    if "kernel_module_version" in state:
        v = state["kernel_module_version"]
        return None if v is None else str(v)
    if state.get("init_error") in ("DRIVER_NOT_LOADED", 9):
        return None
    return str(state.get("driver_version") or "") or None


def validate_torch(value: object) -> None:
    if not isinstance(value, dict) or set(value) - TORCH_KEYS:
        raise ValueError(f"torch: expected a mapping with keys among {', '.join(sorted(TORCH_KEYS))}")


# What a process without a scenario cgroup shows: a login session's, i.e. a host process (cgroup v2).
HOST_CGROUP = "0::/user.slice/user-1000.slice/session-1.scope\n"


def process_cgroups(state: dict[str, Any]) -> dict[int, str]:
    """pid -> the text of its /proc/PID/cgroup, for every process of every GPU and MIG device; none for a process
    whose ``host_state`` is "gone" (it exited: no /proc entry, while the driver still lists its memory)."""
    out: dict[int, str] = {}
    devices = state.get("devices") or ()
    for dev in [*devices, *(m for d in devices for m in d.get("mig_devices") or ())]:
        procs = dev.get("processes") or {}
        for kind in ("compute", "graphics"):
            for p in procs.get(kind) or ():
                if p.get("host_state") == "gone":
                    continue
                text = p.get("cgroup")
                if text is not None or p["pid"] not in out:
                    out[int(p["pid"])] = (text if text.endswith("\n") else text + "\n") if text else HOST_CGROUP
    return out


# root -> the pid -> cgroup text last written under it: the player mirrors on every change of the devices (a
# memory ramp changes them every tick), and the fleet scenario has 4096 processes whose files rarely change.
_WRITTEN: dict[Path, dict[int, str]] = {}


def mirror_procs(root: Path, state: dict[str, Any]) -> None:
    """``proc/<pid>/cgroup`` for the state's GPU processes (attribution reads them; docs/scenarios.md), and no
    directory for a pid that is gone. Only what changed since the last call for this root is touched."""
    proc = root / "proc"
    want = process_cgroups(state)
    before = _WRITTEN.get(root) if proc.is_dir() else None
    if before == want:
        return
    if before is None:  # first call for this root (or the tree went): sweep what an earlier run left
        before = {}
        if proc.is_dir():
            for p in proc.iterdir():
                if p.name.isdigit() and int(p.name) not in want:
                    shutil.rmtree(p, ignore_errors=True)
    for pid in before.keys() - want.keys():
        shutil.rmtree(proc / str(pid), ignore_errors=True)
    for pid, text in want.items():
        if before.get(pid) != text:
            _write(proc / str(pid) / "cgroup", text)
    _WRITTEN[root] = want


def mirror_host(root: Path, state: dict[str, Any]) -> None:
    """Write the kernel module files and device nodes a host with this state has (and remove stale ones)."""
    mirror_procs(root, state)
    kmod = kernel_module(state)
    proc_v = root / "proc" / "driver" / "nvidia" / "version"
    mod = root / "sys" / "module" / "nvidia"
    dev = root / "dev"
    if kmod is None:
        proc_v.unlink(missing_ok=True)
        shutil.rmtree(mod, ignore_errors=True)
        shutil.rmtree(dev, ignore_errors=True)
        return
    _write(proc_v, f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kmod}  Thu Feb 22 01:44:30 UTC 2024\n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")  # fmt: skip
    _write(mod / "version", kmod + "\n")
    want = {"nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(len(state.get("devices") or [])))}
    dev.mkdir(parents=True, exist_ok=True)
    for p in dev.iterdir():
        if p.name.startswith("nvidia") and p.name not in want:
            p.unlink()
    kmsg = dev / "kmsg"  # an empty ring: the simulated kernel logged nothing doctor reads (replays go to the daemon)
    if not kmsg.exists():
        kmsg.write_bytes(b"")
    for name in want:
        node = dev / name
        if not node.exists():
            node.write_bytes(b"")
            node.chmod(0o666)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_manifest(state_dir: Path, *, root: Path, library_dir: Path, state: Path, url: str) -> Path:
    """``<state_dir>/sim-host.json``: where ``gpuwatchd doctor --sim <state_dir>`` finds the simulated host."""
    path = state_dir / MANIFEST
    doc = {"root": str(root), "library_dir": str(library_dir), "state": str(state), "url": url,
           "state_dir": str(state_dir)}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


# The manifest is five paths and a URL: a few hundred bytes. Anything larger was not written by the sim.
MAX_MANIFEST_BYTES = 64 << 10
MANIFEST_KEYS = ("root", "library_dir", "state", "url", "state_dir")


def read_manifest(state_dir: Path) -> dict[str, str]:
    """The manifest :func:`write_manifest` wrote in ``state_dir``, read through the capped, non-blocking reader
    (``config/files.py``); anything else (a FIFO, ``[]``, ``null``, deep JSON, a missing key) is a one-line
    ``ValueError``."""
    from gpuwatchd.config.files import InputFileError, read_text_file

    try:
        text = read_text_file(state_dir / MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
    except InputFileError as e:
        raise ValueError(str(e)) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    out: dict[str, str] = {}
    for key in MANIFEST_KEYS:
        value = doc.get(key)
        if not isinstance(value, str) or not value or "\0" in value:
            raise ValueError(f"{key!r}: expected a non-empty string")
        out[key] = value
    return out
