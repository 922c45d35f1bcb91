"""PyTorch's allocator per process (reported over the training socket, ``sources/training/``) and the socket's own
counters.

Bounded as the per-process families are: a process is exported only while NVML lists it among the top-N processes
of its GPU (the sample holds only those), with the same labels as ``gpuwatchd_gpu_process_memory_used_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, label, spec
from gpuwatchd.model import OWNER_LABELS, GpuSample, ProcessOwner
from gpuwatchd.model.training import TorchReport
from gpuwatchd.store.training import TrainingLedger

_P = ("uuid", "pid", "process", *OWNER_LABELS)
_BY = "as the process' PyTorch caching allocator reports it (gpuwatchd.training; top-N processes by memory per GPU)"
TORCH_ALLOCATED = spec("gpuwatchd_process_torch_allocated_bytes", "gauge",
                       f"GPU memory held by live tensors, {_BY}: NVML's figure without the allocator's cache.",
                       _P, "bytes")
TORCH_RESERVED = spec("gpuwatchd_process_torch_reserved_bytes", "gauge",
                      f"GPU memory the allocator holds from the driver (tensors plus its cache), {_BY}.", _P, "bytes")
TORCH_INACTIVE_SPLIT = spec(
    "gpuwatchd_process_torch_inactive_split_bytes", "gauge",
    f"Reserved memory in split blocks no tensor uses and the allocator cannot release (fragmentation), {_BY}.",
    _P, "bytes")
TORCH_ALLOC_RETRIES = spec(
    "gpuwatchd_process_torch_alloc_retries_total", "counter",
    f"Failed cudaMalloc calls the allocator answered by flushing its cache and retrying (slow steps), {_BY}.", _P)
TORCH_OOMS = spec("gpuwatchd_process_torch_ooms_total", "counter",
                  f"Out-of-memory errors the allocator raised in the process, {_BY}.", _P)
TORCH_INPUT_WAIT = spec(
    "gpuwatchd_process_torch_input_wait_ratio", "gauge",
    "Share of the last report interval a training step spent waiting for its input (gpuwatchd.training.wrap_input "
    "around the data loader), 0..1.", _P, "ratio")

SOCKET_UP = spec("gpuwatchd_training_socket_up", "gauge",
                 "1 when the training socket listens (training.socket), 0 when it cannot (see the log).")
SOCKET_PEERS = spec("gpuwatchd_training_peers", "gauge", "Training processes connected to the socket now.")
SOCKET_CONNECTIONS = spec(
    "gpuwatchd_training_connections_total", "counter",
    "Connections to the training socket, by result=accepted|too_many_peers|no_credentials.", ("result",))
SOCKET_MESSAGES = spec(
    "gpuwatchd_training_messages_total", "counter",
    "Lines read on the training socket, by result=accepted|oversized|malformed|unsupported_version|no_gpu_context|"
    "rate_limited|unmatched_device (a device entry matching no GPU the process is listed on).", ("result",))

_VALUES = ((TORCH_ALLOCATED, "allocated_bytes"), (TORCH_RESERVED, "reserved_bytes"),
           (TORCH_INACTIVE_SPLIT, "inactive_split_bytes"), (TORCH_ALLOC_RETRIES, "alloc_retries"),
           (TORCH_OOMS, "ooms"), (TORCH_INPUT_WAIT, "input_wait_ratio"))


def training_families(gpus: Iterable[GpuSample], ledger: TrainingLedger,
                      owners: Mapping[tuple[str, int], ProcessOwner] | None) -> list[Metric]:
    """The allocator series of each reporting process NVML lists now, and the socket's state."""
    f = Families()
    reports = ledger.reports
    if reports:
        owners = owners or {}
        for g in gpus:
            seen: set[int] = set()
            for p in g.processes:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                r: TorchReport | None = reports.get((g.uuid, p.pid))
                if r is None:
                    continue
                o = owners.get((g.uuid, p.pid))
                own = o.labels() if o is not None else None
                labels = (g.uuid, str(p.pid), label(p.name))
                for s, name in _VALUES:
                    f.add_owned(s, labels, own, getattr(r, name))
    st = ledger.status
    if st is not None:
        f.add(SOCKET_UP, (), st.up)
        f.add(SOCKET_PEERS, (), st.peers)
        for result, n in st.connections.items():
            f.add(SOCKET_CONNECTIONS, (result,), n)
        for result, n in st.messages.items():
            f.add(SOCKET_MESSAGES, (result,), n)
    return f.metrics()
