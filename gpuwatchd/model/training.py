"""What a training process told the daemon about PyTorch's allocator (the ``gpuwatchd.training`` client, read by
``sources/training/``): per GPU and host pid, as values and the events that carry them into the store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TorchOom:
    """One out-of-memory error as torch's observer saw it: what was asked for and what the device had."""

    timestamp: float
    requested_bytes: int | None = None
    device_allocated_bytes: int | None = None
    device_free_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TorchReport:
    """One process' allocator on one GPU at ``timestamp`` (an event for ``Store.ingest``): None where the client's
    torch did not report the field. Counters (retries, OOMs, device allocs/frees) are cumulative in the process."""

    uuid: str
    pid: int
    timestamp: float
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    device_allocs: int | None = None
    device_frees: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    input_wait_ratio: float | None = None
    oom: TorchOom | None = None


@dataclass(frozen=True, slots=True)
class TrainingSocketStatus:
    """The training socket's state (an event for ``Store.ingest``): whether it listens, where, why not, the peers
    connected now and what it counted since start (connections and lines, by result)."""

    up: bool
    path: str | None = None
    error: str | None = None
    peers: int = 0
    connections: Mapping[str, int] = field(default_factory=dict)
    messages: Mapping[str, int] = field(default_factory=dict)
