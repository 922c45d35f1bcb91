"""What the daemon does with kernel-log records: Xids into the store (de-duplicated against NVML), GpuLost at once
on a fall off the bus, address -> UUID mapping, AER errors by GPU, and the counters the exporter shows.

No I/O and no clock of its own: :mod:`gpuwatchd.sources.kmsg.reader` hands records in with their time, and the
PCI topology (which ports sit above which GPU) comes in as a function, so the live daemon, the sim's replay and
tests share all of it. docs/kernel-log.md describes the behaviour.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from gpuwatchd.gpu.sxid_catalog import sxid_name
from gpuwatchd.model import (
    GpuLostEvent,
    KernelLogCount,
    KernelLogDriver,
    KernelLogRead,
    KernelLogStarted,
    Snapshot,
    XidEvent,
)
from gpuwatchd.model.kernel_log import KernelLogStats
from gpuwatchd.runtime.log_limit import LogLimit
from gpuwatchd.sources.kmsg import parse as kp
from gpuwatchd.sources.kmsg.dedup import XidDeduplicator
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

# Xid 79 and "GPU at ... has fallen off the bus" come together (kern04: 2 us apart), and the driver may repeat the
# latter: reports of one GPU within this many seconds are one fall.
FALL_MERGE_SECONDS = 60.0
MAX_ADDRESSES = 256  # address -> UUID entries kept (and persisted); a host has at most a few dozen GPUs
XID_FALLEN_OFF = 79
TOPOLOGY_RETRY_SECONDS = 60.0  # an address not in sysfs (gone, forged) is looked up again after this long

Topology = Callable[[str], Sequence[str]]  # GPU address -> the addresses of the ports above it (store form)


class KernelLogIngest:
    """Applies kernel-log records to the store, through its one door (``Store.ingest``: the counters are the store's,
    ``Store.kernel_log``). Single-threaded: called on the daemon's event loop."""

    def __init__(self, store: Store, *, topology: Topology | None = None, dedup_window: float = 10.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.store = store
        self._on_change = on_change
        store.ingest(KernelLogStarted())
        self.addresses: dict[str, str] = {}  # store-form PCI address -> UUID, kept after the GPU is gone
        self.dedup = XidDeduplicator(dedup_window)
        self._topology = topology or (lambda _address: ())
        self._falls: dict[str, float] = {}  # uuid or address -> time of the last counted fall
        self._held_lost: dict[str, float] = {}  # uuid -> since: lost per the kernel, NVML not caught up yet
        self._ancestors: dict[str, tuple[str, ...]] = {}  # GPU address -> ports above it, remembered
        self._no_ports: dict[str, float] = {}  # GPU address -> when sysfs last had no ports for it
        self._below: dict[str, set[str]] = {}  # port -> the GPU addresses below it (the inverse of _ancestors)
        self._malformed_logged = False
        self._log_limit = LogLimit()  # driver-error lines are logged at most once a minute per kind

    # -- records --------------------------------------------------------------------------------------------------

    def apply(self, record: kp.KmsgRecord, t: float, *, history: bool = False) -> None:
        """One record read at ``t`` (daemon clock: when the kernel logged it, as near as the reader can tell).

        ``history``: a record from before the daemon watched this boot (reader.py): it teaches addresses and
        versions, but its Xids, falls and AER errors are not counted as new events.
        """
        kinds: list[str] = []
        counts: list[KernelLogCount] = []  # handed to the store with the record, in one event
        for line in record.message.split("\n"):
            if not line.strip():
                continue
            try:
                event = kp.classify(line)
            except (ValueError, OverflowError, RecursionError) as e:  # a parser bug: the line goes, the source stays
                kinds.append("malformed")
                self._malformed(f"{type(e).__name__}: {e}")
                continue
            kinds.append(kp.kind_of(event))
            if history and isinstance(event, kp.Xid | kp.Sxid | kp.FallenOffBus | kp.AerError):
                continue
            if event is not None and not isinstance(event, kp.Malformed):
                self._event(event, line.strip(), t, counts)
                if self._on_change is not None:
                    self._on_change()
        self.store.ingest(KernelLogRead(record.seq, tuple(kinds), tuple(counts)))

    @property
    def stats(self) -> KernelLogStats:
        """What the kernel log has counted so far (the store's, read only)."""
        stats = self.store.kernel_log
        assert stats is not None  # KernelLogStarted in __init__
        return stats

    def _malformed(self, why: str) -> None:
        if not self._malformed_logged:
            self._malformed_logged = True
            log.warning("kernel log: dropped a line the parser could not read (%s); further ones are only counted in"
                        " gpuwatchd_kernel_log_lines_total{kind=\"malformed\"}", why[:200])

    def _event(self, ev: kp.KernelEvent, line: str, t: float, counts: list[KernelLogCount]) -> None:
        if isinstance(ev, kp.GpuAddress):
            self.remember(ev.pci_bus_id, ev.uuid)
            self._held_lost.pop(ev.uuid, None)  # the driver (re)initialised it: NVML decides again
        elif isinstance(ev, kp.Xid):
            uuid = self.uuid_at(ev.pci_bus_id)
            xid = XidEvent(uuid, ev.code, t, "kmsg", ev.pci_bus_id, ev.text or None)
            counts.append(_report(xid, uuid))
            if self.dedup.admit(xid, uuid):
                self.store.ingest(xid)
            if ev.code == XID_FALLEN_OFF:
                self._fell(ev.pci_bus_id, t, counts)
        elif isinstance(ev, kp.Sxid):
            key = (ev.switch, str(ev.code))
            counts.append(KernelLogCount("sxid", key, t))
            if ev.fatal:
                counts.append(KernelLogCount("sxid_fatal", key, t))
            self._log_limit.log(log, logging.WARNING, "sxid", "kernel log: NVSwitch %s: %s (%s)", ev.switch,
                                line[: kp.MAX_TEXT_CHARS], sxid_name(ev.code))
        elif isinstance(ev, kp.FallenOffBus):
            self._fell(ev.pci_bus_id, t, counts)
        elif isinstance(ev, kp.AerError):
            uuid = self._gpu_below(ev.source, ev.port)
            counts.append(KernelLogCount("aer", (uuid or "unknown", ev.severity)))
        elif isinstance(ev, kp.DriverLoaded):
            self.store.ingest(KernelLogDriver(version=ev.version))
        elif isinstance(ev, kp.VersionMismatch | kp.RmInitFailed):
            if isinstance(ev, kp.VersionMismatch):
                self.store.ingest(KernelLogDriver(mismatch=ev.text))
            self._log_limit.log(log, logging.WARNING, kp.kind_of(ev), "kernel log: %s", line[: kp.MAX_TEXT_CHARS])
        # pciehp link and thunderbolt lines are counted by kind (lines_total) and shown in the log's replay; the
        # Thunderbolt source (sources/ tb) and the PCI hot-plug watch act on the same changes from sysfs.

    def _fell(self, address: str | None, t: float, counts: list[KernelLogCount]) -> None:
        uuid = self.uuid_at(address) if address else self._only_gpu()
        key = uuid or address or "unknown"
        last = self._falls.get(key)
        if last is not None and 0 <= t - last < FALL_MERGE_SECONDS:
            return
        self._falls.pop(key, None)
        self._falls[key] = t
        while len(self._falls) > MAX_ADDRESSES:  # forged addresses must not grow it: the oldest fall goes first
            del self._falls[next(iter(self._falls))]
        label = uuid or "unknown"
        counts.append(KernelLogCount("fallen_off_bus", (label,)))
        if uuid is not None and self.store.ingest(GpuLostEvent(uuid, t)):
            self._held_lost[uuid] = t
            log.warning("kernel log: GPU %s at PCI %s has fallen off the bus", uuid, address)

    # -- NVML snapshots ------------------------------------------------------------------------------------------

    def filter_snapshot(self, snap: Snapshot) -> Snapshot:
        """Drop the NVML Xid events the kernel log already counted (call before ``Store.apply``)."""
        if not snap.xid_events:
            return snap
        kept = []
        for ev in snap.xid_events:
            self.store.ingest(_report(ev, ev.uuid))
            if self.dedup.admit(ev, ev.uuid):
                kept.append(ev)
        return snap if len(kept) == len(snap.xid_events) else replace(snap, xid_events=tuple(kept))

    def after_snapshot(self, snap: Snapshot) -> None:
        """Keep a GPU the kernel reported fallen off lost until NVML sees it gone too (call after ``Store.apply``).

        NVML may answer for a poll or two after the kernel logged the fall; without this, GpuLost would fire on the
        kernel line and resolve on the next snapshot. Once NVML reports it lost or removed, presence is NVML's again
        (so a re-plug resolves the alert as before); a new ``NVRM: GPU at`` line for it (driver re-init) also ends
        the hold.
        """
        for g in snap.gpus:
            if g.pci_bus_id is not None:
                self.remember(g.pci_bus_id, g.uuid)
        if not self._held_lost:
            return
        present = {g.uuid for g in snap.gpus}
        for uuid, since in list(self._held_lost.items()):
            if uuid in present:
                self.store.ingest(GpuLostEvent(uuid, since))
            elif snap.nvml_ok:
                del self._held_lost[uuid]

    # -- addresses ------------------------------------------------------------------------------------------------

    def remember(self, address: str, uuid: str) -> None:
        norm = kp.normalize_pci(address)
        if norm is None:
            return
        if self.addresses.get(norm) != uuid:
            self.addresses.pop(norm, None)
            self.addresses[norm] = uuid
            while len(self.addresses) > MAX_ADDRESSES:
                del self.addresses[next(iter(self.addresses))]
        self._ports(norm)

    def _ports(self, address: str) -> tuple[str, ...]:
        """The ports above a GPU address, from sysfs once; an address sysfs does not have is asked again only after
        TOPOLOGY_RETRY_SECONDS, so a flood of AER lines against forged addresses costs no file-system calls."""
        ports = self._ancestors.get(address)
        if ports is not None:
            return ports
        now = time.monotonic()
        missed = self._no_ports.get(address)
        if missed is not None and now - missed < TOPOLOGY_RETRY_SECONDS:
            return ()
        ports = tuple(self._topology(address))
        if not ports:
            self._no_ports.pop(address, None)
            self._no_ports[address] = now
            while len(self._no_ports) > MAX_ADDRESSES:
                del self._no_ports[next(iter(self._no_ports))]
            return ports
        self._no_ports.pop(address, None)
        self._ancestors[address] = ports
        for port in ports:
            self._below.setdefault(port, set()).add(address)
        while len(self._ancestors) > MAX_ADDRESSES:
            old = next(iter(self._ancestors))
            for port in self._ancestors.pop(old):
                below = self._below.get(port)
                if below is not None:
                    below.discard(old)
                    if not below:
                        del self._below[port]
        return ports

    def load_addresses(self, addresses: Mapping[str, str]) -> None:
        for address, uuid in list(addresses.items())[-MAX_ADDRESSES:]:
            self.remember(address, uuid)

    def uuid_at(self, address: str | None) -> str | None:
        """The GPU at a PCI address: one NVML sees there now, else the last one the log or NVML put there."""
        norm = kp.normalize_pci(address) if address else None
        if norm is None:
            return None
        gone: str | None = None
        for uuid, pres in self.store.presence.items():
            if pres.identity.pci_bus_id is not None and kp.normalize_pci(pres.identity.pci_bus_id) == norm:
                if pres.state == "present":
                    return uuid
                gone = uuid
        return self.addresses.get(norm) or gone

    def _only_gpu(self) -> str | None:
        uuids = set(self.store.presence) | set(self.addresses.values())
        return next(iter(uuids)) if len(uuids) == 1 else None

    def _gpu_below(self, *addresses: str | None) -> str | None:
        """The one GPU at or below these addresses (an AER error names a port and a source device)."""
        wanted = {a for a in addresses if a}
        for a in wanted:
            uuid = self.uuid_at(a)
            if uuid is not None:
                return uuid
        for gpu_address in self._present_addresses():  # a GPU NVML sees may not have been looked up yet
            self._ports(gpu_address)
        # The GPUs below the named ports, from the port -> GPU index: a flood of AER lines costs a lookup each, not a
        # walk over every remembered address.
        below = set().union(*(self._below.get(a, ()) for a in wanted))
        if not below:
            return None
        known = set(self._gpu_addresses())
        candidates: set[str] = set()
        for gpu_address in sorted(below & known):
            uuid = self.uuid_at(gpu_address)
            if uuid is not None:
                candidates.add(uuid)
        return candidates.pop() if len(candidates) == 1 else None

    def _present_addresses(self) -> Iterable[str]:
        for pres in self.store.presence.values():
            if pres.identity.pci_bus_id is not None:
                norm = kp.normalize_pci(pres.identity.pci_bus_id)
                if norm is not None:
                    yield norm

    def _gpu_addresses(self) -> Iterable[str]:
        seen = set(self.addresses)
        for pres in self.store.presence.values():
            if pres.identity.pci_bus_id is not None:
                norm = kp.normalize_pci(pres.identity.pci_bus_id)
                if norm is not None:
                    seen.add(norm)
        return sorted(seen)


def _report(ev: XidEvent, uuid: str | None) -> KernelLogCount:
    """An Xid report of one path (``source``: kmsg or nvml), counted before de-duplication."""
    return KernelLogCount("xid_reports", (uuid or "unknown", str(ev.xid), ev.source))
