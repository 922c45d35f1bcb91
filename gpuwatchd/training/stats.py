"""What the client reads from PyTorch's CUDA caching allocator, and the one seam tests replace.

:func:`read_devices` is the only function that calls torch's CUDA memory API; everything after it (:func:`summarize`,
the message) is plain code over the dict ``torch.cuda.memory_stats()`` returns, so tests replay dicts PyTorch users
published (tests/fixtures/training/README.md) through it. Key names: torch/cuda/memory.py ``memory_stats``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RawDevice:
    """One CUDA device as torch reports it: its ordinal in this process, its UUID (None when torch cannot say),
    ``memory_stats()`` as returned, and ``mem_get_info()`` (free, total) where read."""

    index: int
    uuid: str | None
    stats: Mapping[str, Any]
    free_bytes: int | None = None
    total_bytes: int | None = None


# memory_stats() key -> the message field. Bytes are the "all" pool's current value; counters are cumulative.
FIELDS: dict[str, str] = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "active_bytes.all.current": "active_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
    "num_device_alloc": "device_allocs",
    "num_device_free": "device_frees",
}


def _count(value: object) -> int | None:
    # bool is an int subclass; a stats dict never holds one, so one there is not a reading
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def summarize(dev: RawDevice) -> dict[str, Any]:
    """The message's entry for one device: the fields above that the dict has (an older torch lacks
    ``num_device_alloc``; a CPU build's dict is empty), plus free/total memory and the device's identity."""
    out: dict[str, Any] = {"index": dev.index}
    if dev.uuid:
        out["uuid"] = dev.uuid
    for key, name in FIELDS.items():
        v = _count(dev.stats.get(key))
        if v is not None:
            out[name] = v
    for name, value in (("free_bytes", dev.free_bytes), ("total_bytes", dev.total_bytes)):
        v = _count(value)
        if v is not None:
            out[name] = v
    return out


def gpu_uuid(props: object) -> str | None:
    """NVML's spelling (``GPU-xxxxxxxx-...``) of the UUID torch reports on a device's properties (``uuid``, torch
    >= 2.0: a ``_CUuuid`` whose ``str`` is the bare UUID); None where torch has none."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw)
    if not text:
        return None
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def read_devices(torch: Any) -> list[RawDevice]:
    """The CUDA devices this process uses, read from ``torch``: the seam tests replace.

    Only devices whose allocator has reserved memory count as used: ``mem_get_info`` on any other device would
    create a CUDA context there (hundreds of MiB, and a process NVML then lists on a GPU it never meant to use).
    Nothing here initialises CUDA: a process that has not touched it yet reports no device.
    """
    cuda = torch.cuda
    if not cuda.is_available() or not cuda.is_initialized():
        return []
    out = []
    for i in range(cuda.device_count()):
        stats = cuda.memory_stats(i)
        if not stats.get("reserved_bytes.all.current"):
            continue
        free, total = cuda.mem_get_info(i)
        out.append(RawDevice(i, gpu_uuid(cuda.get_device_properties(i)), stats, free, total))
    return out
