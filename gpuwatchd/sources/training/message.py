"""One line from a ``gpuwatchd.training`` client (schema 1, ``gpuwatchd/training/wire.py``) into store events.

Pure: the line, the peer's host pid, the GPUs NVML lists that pid on, and the time in; reports or the reason the line
was refused out. Nothing a client sends can make this raise: every field is checked for type and range, unknown
fields are ignored, and a device the process is not listed on is dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gpuwatchd.model.training import TorchOom, TorchReport

SCHEMA_VERSION = 1  # gpuwatchd/training/wire.py SCHEMA_VERSION (the client imports nothing of the daemon)
MAX_DEVICES = 64  # more CUDA devices than any host has: a longer list is not a client's
MAX_COUNT = (1 << 63) - 1
MAX_UUID_LENGTH = 96
_FIELDS = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "alloc_retries", "ooms",
           "device_allocs", "device_frees", "free_bytes", "total_bytes")


@dataclass(frozen=True, slots=True)
class Parsed:
    """The reports of one line (one per device matched to a GPU) and the devices that matched none."""

    reports: tuple[TorchReport, ...]
    unmatched: int = 0


class Refused(ValueError):
    """A line not taken, with its reason as counted in ``gpuwatchd_training_messages_total{result}``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT else None


def _ratio(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0.0 <= v <= 1.0:
        return float(v)
    return None


def parse(line: bytes, host_pid: int, gpus: Collection[str], now: float) -> Parsed:
    """The reports in ``line`` from the process ``host_pid``, which NVML lists on ``gpus``.

    A device entry names its GPU by ``uuid`` (NVML's spelling); without one, it is attributed only when the
    process is on exactly one GPU. Raises :class:`Refused` for a line that is not schema 1."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise Refused("malformed", f"not JSON: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise Refused("malformed", "not a JSON object")
    if msg.get("v") != SCHEMA_VERSION:
        raise Refused("unsupported_version", f"schema version {str(msg.get('v'))[:20]!r}, this daemon reads 1")
    devices = msg.get("devices")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise Refused("malformed", "devices: not a list of at most 64 entries")
    if not gpus:
        raise Refused("no_gpu_context", f"pid {host_pid} holds no GPU context NVML lists")
    wait = _ratio(msg.get("input_wait_ratio"))
    oom_dev, oom = _oom(msg.get("oom"), now)
    only = next(iter(gpus)) if len(gpus) == 1 else None
    reports: list[TorchReport] = []
    unmatched = 0
    seen: set[str] = set()
    for d in devices:
        if not isinstance(d, dict):
            raise Refused("malformed", "devices: an entry is not an object")
        uuid = d.get("uuid")
        if isinstance(uuid, str) and len(uuid) <= MAX_UUID_LENGTH and uuid in gpus:
            target: str | None = uuid
        elif uuid is None and only is not None:
            target = only
        else:
            target = None
        if target is None or target in seen:
            unmatched += 1
            continue
        seen.add(target)
        values = {f: _count(d.get(f)) for f in _FIELDS}
        index = d.get("index")
        reports.append(TorchReport(
            target, host_pid, now, **values,
            input_wait_ratio=wait, oom=oom if oom is not None and index == oom_dev else None))
    if not reports and wait is not None and only is not None:  # the input wait alone, before CUDA is used
        reports.append(TorchReport(only, host_pid, now, input_wait_ratio=wait))
    return Parsed(tuple(reports), unmatched)


def _oom(v: Any, now: float) -> tuple[int | None, TorchOom | None]:
    if not isinstance(v, dict):
        return None, None
    dev = v.get("device")
    return (dev if isinstance(dev, int) else None,
            TorchOom(now, _count(v.get("requested_bytes")), _count(v.get("device_allocated_bytes")),
                     _count(v.get("device_free_bytes"))))


def refusal_line(why: str) -> bytes:
    """What the daemon writes before closing a connection it refuses."""
    return json.dumps({"v": SCHEMA_VERSION, "error": why}).encode() + b"\n"
