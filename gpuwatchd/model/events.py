"""What changes what the daemon knows, as values: the events a source hands to ``Store.ingest`` (the one door).

Snapshots from the NVML worker enter through ``Store.apply``; everything else enters as one of these, or as a model
value that already says what happened (``XidEvent`` from the kernel log, ``SourceStatus``, ``Attribution``). The
store applies each one and bumps its version there, so readers (the ``/metrics`` cache) see every change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the package's __init__ imports this module; these are only annotations
    from collections.abc import Mapping

    from gpuwatchd.model import DockSample, LinkSample
    from gpuwatchd.model.health import GpuHealth
    from gpuwatchd.model.probes import ProbeRecord


@dataclass(frozen=True, slots=True)
class GpuLostEvent:
    """The kernel log says a known GPU fell off the bus: lost since ``since``, before NVML notices."""

    uuid: str
    since: float


@dataclass(frozen=True, slots=True)
class NvmlStale:
    """The NVML worker missed its deadline: the last values are held and flagged stale until the next snapshot."""


@dataclass(frozen=True, slots=True)
class NvmlCounters:
    """The NVML supervisor's counters, whenever one of them changes."""

    worker_restarts: int
    init_failures: int


@dataclass(frozen=True, slots=True)
class LinkChange:
    """The PCIe links read from sysfs now (``sources/sysfs/pcie.py``), replacing the previous set."""

    links: tuple[LinkSample, ...]


@dataclass(frozen=True, slots=True)
class DockChange:
    """The Thunderbolt devices attached now (``sources/sysfs/thunderbolt.py``), with the GPUs behind them."""

    docks: tuple[DockSample, ...]


@dataclass(frozen=True, slots=True)
class ConfigReload:
    """A configuration was loaded (at start or on SIGHUP): whether it took, and when (None: a failure, the time of
    the last success stands)."""

    success: bool
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class KernelLogStarted:
    """The kernel-log source runs: the store starts its counters (``model/kernel_log.py``, ``Store.kernel_log``),
    which only the events below change."""


@dataclass(slots=True)  # a value all the same: one a kernel-log record, and frozen's __init__ costs 0.4 us
class KernelLogRead:
    """One kernel-log record read (``sources/kmsg/ingest.py``): its sequence number, the kind of each of its lines
    (``model/kernel_log.py`` ``KINDS``) and what it counted; ``seq`` is None for a record without a readable
    header."""

    seq: int | None
    kinds: tuple[str, ...]
    counts: tuple[KernelLogCount, ...] = ()


@dataclass(slots=True)  # a value all the same: one a kernel-log record, and frozen's __init__ costs 0.4 us
class KernelLogCount:
    """One more in a series the kernel log counts by label: ``xid_reports`` (uuid, xid, source), ``fallen_off_bus``
    (uuid,), ``aer`` (uuid, severity), ``sxid`` / ``sxid_fatal`` (switch, sxid).
    A new key past the family's series limit counts in ``series_dropped``."""

    series: Literal["xid_reports", "fallen_off_bus", "aer", "sxid", "sxid_fatal"]
    key: tuple[str, ...]
    t: float | None = None  # when it was logged (daemon clock); the SXid rule's window reads it


@dataclass(frozen=True, slots=True)
class KernelLogDriver:
    """What the kernel log says of the driver: the version it loaded, a version mismatch (None: not said)."""

    version: str | None = None
    mismatch: str | None = None


@dataclass(frozen=True, slots=True)
class KernelLogUp:
    """The kernel-log reader opened its device (``up``) or lost it, and why."""

    up: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class KernelLogLoss:
    """Records the reader did not get whole: ``lost`` more overwritten before they were read (the ring wrapped),
    ``cut`` records longer than its limit so far (None: unchanged)."""

    lost: int = 0
    cut: int | None = None


@dataclass(frozen=True, slots=True)
class StateFileSetAside:
    """A state file found unusable at start and moved aside (``state_files.py``): kernel_log, probe_baselines ..."""

    name: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class HealthChange:
    """Every GPU's health state, reason and action as assessed at a rule evaluation (``daemon/health_view.py``)."""

    health: Mapping[str, GpuHealth]


@dataclass(frozen=True, slots=True)
class ProbeAvailability:
    """Whether the torch probes can run here, and why not (``probes/service.py``)."""

    available: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class ProbeSkipped:
    """A probe run on a GPU that was due did not happen, and why (busy, not present, unavailable ...)."""

    uuid: str
    reason: str
    timestamp: float


@dataclass(frozen=True, slots=True)
class ProbeResultEvent:
    """The records of one probe run on one GPU (one per probe, or one ``worker`` record)."""

    records: tuple[ProbeRecord, ...]
    building: bool = False  # some baseline of the GPU is still being built


@dataclass(frozen=True, slots=True)
class ProbeBaselineResets:
    """Corrupt probe baseline files found and rebuilt (``probes/baseline.py``) since start."""

    resets: int
