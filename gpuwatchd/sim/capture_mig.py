"""MIG devices of an ``nvidia-smi -q -x`` capture (``<mig_devices>``), replayed as the stand-in's ``mig_devices``.

What a capture prints per MIG device: its index, GPU and compute instance ids, shared engine counts (SMs, copy
engines, ...) and framebuffer memory; processes carry the GPU/compute instance they run in. What it does not
print is filled in, and documented as such (docs/sim-state.md):

- the MIG device's UUID: a stable ``MIG-<uuid5>`` from the GPU's UUID and the instance ids (drivers' MIG UUIDs are
  name-based UUIDs too, but of data the capture lacks), so every replay of a capture names it alike;
- its profile, which the capture shows nowhere: ``<compute slices>g.<memory>gb`` as the profile names read, the
  slices from the SM count (14 SMs a slice on Ampere, 16 on Hopper: A100 1g = 14 SMs, 7g = 98; H100 1g = 16,
  7g = 132), the memory rounded up to whole GiB (A100-80GB 1g.10gb has 9856 MiB). Unknown architecture: no
  profile (the name is then the GPU's followed by " MIG").
"""

from __future__ import annotations

import math
import uuid
import xml.etree.ElementTree as ET
from typing import Any

from gpuwatchd.sim.capture_values import CaptureError, integer, mib_bytes, text, where

# SMs in one MIG compute slice, by <product_architecture>; a 7-slice profile may have fewer than 7x (A100: 98).
SMS_PER_SLICE = {"ampere": 14, "hopper": 16}
MAX_SLICES = 7
_GIB = 1 << 30


def mig_uuid(gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A stable MIG device UUID for a capture that prints none."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"))


def profile(architecture: str | None, sms: int | None, memory_total: int | None) -> str | None:
    """``1g.20gb`` from the SM count and memory of a MIG device; None where the slice size is not known."""
    per = SMS_PER_SLICE.get((architecture or "").lower())
    if per is None or sms is None or memory_total is None or sms < per:
        return None
    return f"{min(MAX_SLICES, sms // per)}g.{math.ceil(memory_total / _GIB)}gb"


def mig_devices_from_gpu(gpu: ET.Element, gpu_uuid: str, processes: dict[str, list[dict[str, Any]]]
                         ) -> list[dict[str, Any]] | None:
    """The capture's MIG devices of ``gpu`` (None: it lists none); moves the processes that run in one out of
    ``processes`` (the GPU's lists) into that MIG device's."""
    elements = list(gpu.iterfind("mig_devices/mig_device"))
    if not elements:
        return None
    architecture = text(gpu, "product_architecture")
    out: list[dict[str, Any]] = []
    by_ids: dict[tuple[int, int], dict[str, Any]] = {}
    for number, el in enumerate(elements):
        path = f"mig_devices/mig_device[{number + 1}]"
        index = integer(el, "index", gpu=None)
        gi = integer(el, "gpu_instance_id", gpu=None)
        ci = integer(el, "compute_instance_id", gpu=None)
        if index is None or gi is None or ci is None:
            raise CaptureError(f"{where(gpu, path)}: a MIG device needs an index, gpu_instance_id and "
                               "compute_instance_id")
        total = mib_bytes(el, "fb_memory_usage/total")
        used = mib_bytes(el, "fb_memory_usage/used")
        memory = None if total is None or used is None else {
            "total": total, "reserved": mib_bytes(el, "fb_memory_usage/reserved") or 0, "used": used}
        sms = integer(el, "device_attributes/shared/multiprocessor_count", gpu=None)
        device: dict[str, Any] = {
            "index": index, "uuid": mig_uuid(gpu_uuid, gi, ci), "profile": profile(architecture, sms, total),
            "gpu_instance_id": gi, "compute_instance_id": ci, "memory": memory,
            "processes": {"compute": [], "graphics": []},
        }
        out.append(device)
        by_ids[gi, ci] = device
    _attribute(gpu, processes, by_ids)
    return out


def _attribute(gpu: ET.Element, processes: dict[str, list[dict[str, Any]]],
               by_ids: dict[tuple[int, int], dict[str, Any]]) -> None:
    """Processes that name a GPU/compute instance belong to that MIG device, not to the GPU's own lists."""
    for number, info in enumerate(gpu.iterfind("processes/process_info")):
        gi = integer(info, "gpu_instance_id", gpu=None)
        ci = integer(info, "compute_instance_id", gpu=None)
        if gi is None or ci is None:
            continue
        target = by_ids.get((gi, ci))
        if target is None:
            raise CaptureError(f"{where(gpu, f'processes/process_info[{number + 1}]')}: runs in GPU instance {gi} "
                               f"compute instance {ci}, which <mig_devices> does not list")
        pid = integer(info, "pid", gpu=None)
        for kind in ("compute", "graphics"):
            moved = [p for p in processes[kind] if p["pid"] == pid]
            processes[kind][:] = [p for p in processes[kind] if p["pid"] != pid]
            target["processes"][kind].extend(moved)
