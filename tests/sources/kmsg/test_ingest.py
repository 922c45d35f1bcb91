"""What kernel-log records do to the store: Xids counted once across NVML and the kernel log, GpuLost at once on a
fall off the bus (and held until NVML agrees), the address -> UUID map, AER errors by topology."""

from __future__ import annotations

from gpuwatchd.model import GpuSample, LostGpu, Snapshot, XidEvent
from gpuwatchd.rules import presence, xid
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import KmsgRecord
from gpuwatchd.store import Store

UUID = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30"
OTHER = "GPU-7d52c1a0-41a2-4c35-9a4f-0a2000a20000"
BUS = "00000000:06:00.0"
T0 = 1_700_000_000.0


def gpu(uuid: str = UUID, bus: str = BUS, index: int = 0) -> GpuSample:
    return GpuSample(uuid=uuid, index=index, name="NVIDIA GeForce RTX 3090", pci_bus_id=bus)


def snap(t: float, *gpus: GpuSample, xids: tuple[XidEvent, ...] = (), lost: tuple[LostGpu, ...] = ()) -> Snapshot:
    return Snapshot(timestamp=t, nvml_ok=True, gpus=gpus, xid_events=xids, lost=lost)


def rec(seq: int, message: str) -> KmsgRecord:
    return KmsgRecord(seq=seq, usec=seq * 1000, level=4, facility=0, message=message)


def feed(ingest: KernelLogIngest, store: Store, s: Snapshot) -> None:
    """What the daemon does with a snapshot when the kernel-log source runs."""
    s = ingest.filter_snapshot(s)
    store.apply(s)
    ingest.after_snapshot(s)


def xid_line(code: int, bus: str = "0000:06:00", rest: str = "pid=77, name=python3, Ch 00000008") -> str:
    return f"NVRM: Xid (PCI:{bus}): {code}, {rest}"


def setup() -> tuple[Store, KernelLogIngest]:
    store = Store()
    ingest = KernelLogIngest(store, dedup_window=10.0)
    feed(ingest, store, snap(T0, gpu()))
    return store, ingest


def test_kernel_first_then_nvml_counts_once() -> None:
    store, ingest = setup()
    ingest.apply(rec(1, xid_line(13)), T0 + 1)
    assert store.xid_counts == {(UUID, 13): 1}
    feed(ingest, store, snap(T0 + 2, gpu(), xids=(XidEvent(UUID, 13, T0 + 2),)))
    assert store.xid_counts == {(UUID, 13): 1}
    assert ingest.stats.xid_reports == {(UUID, "13", "kmsg"): 1, (UUID, "13", "nvml"): 1}
    assert [e.source for e in store.recent_xids] == ["kmsg"]


def test_nvml_first_then_kernel_counts_once() -> None:
    store, ingest = setup()
    feed(ingest, store, snap(T0 + 2, gpu(), xids=(XidEvent(UUID, 31, T0 + 2),)))
    ingest.apply(rec(1, xid_line(31)), T0 + 2.5)
    assert store.xid_counts == {(UUID, 31): 1}


def test_storm_pairs_one_to_one() -> None:
    store, ingest = setup()
    for i in range(9):
        ingest.apply(rec(i + 1, xid_line(94)), T0 + 1 + i * 0.01)
    feed(ingest, store, snap(T0 + 2, gpu(), xids=tuple(XidEvent(UUID, 94, T0 + 2) for _ in range(9))))
    assert store.xid_counts == {(UUID, 94): 9}
    # one more NVML report than the kernel had: that one is new
    feed(ingest, store, snap(T0 + 3, gpu(), xids=(XidEvent(UUID, 94, T0 + 3),)))
    assert store.xid_counts == {(UUID, 94): 10}


def test_outside_the_window_or_another_code_or_gpu_counts_twice() -> None:
    store, ingest = setup()
    feed(ingest, store, snap(T0, gpu(), gpu(OTHER, "00000000:41:00.0", 1)))
    ingest.apply(rec(1, xid_line(13)), T0 + 1)
    feed(ingest, store, snap(T0 + 30, gpu(), gpu(OTHER, "00000000:41:00.0", 1),
                             xids=(XidEvent(UUID, 13, T0 + 30), XidEvent(UUID, 31, T0 + 30),
                                   XidEvent(OTHER, 13, T0 + 30))))
    assert store.xid_counts == {(UUID, 13): 2, (UUID, 31): 1, (OTHER, 13): 1}


def test_fall_off_raises_gpu_lost_at_once_and_holds_until_nvml_agrees() -> None:
    store, ingest = setup()
    ingest.apply(rec(1, "NVRM: GPU at PCI:0000:06:00: " + UUID), T0 + 1)
    ingest.apply(rec(2, "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."), T0 + 1)
    ingest.apply(rec(3, "NVRM: GPU at 0000:06:00.0 has fallen off the bus."), T0 + 1)
    assert store.presence[UUID].state == "lost"
    assert store.presence[UUID].since == T0 + 1
    lost = [c for c in presence.conditions(store, T0 + 1, RulesConfig()) if c.name == "GpuLost" and c.level != "clear"]
    assert [c.labels["uuid"] for c in lost] == [UUID]
    assert ingest.stats.fallen_off_bus == {UUID: 1}  # Xid 79 and the "GPU at" line are one fall
    # NVML still answers for a poll: the GPU stays lost, since the kernel's time
    feed(ingest, store, snap(T0 + 2, gpu()))
    assert (store.presence[UUID].state, store.presence[UUID].since) == ("lost", T0 + 1)
    # NVML reports it lost too, then removed, then it is re-plugged: presence is NVML's again
    feed(ingest, store, snap(T0 + 3, lost=(LostGpu(index=0, uuid=UUID, pci_bus_id=BUS),)))
    feed(ingest, store, snap(T0 + 4))
    assert store.presence[UUID].state == "removed"
    feed(ingest, store, snap(T0 + 5, gpu(bus="00000000:71:00.0")))
    assert store.presence[UUID].state == "present"


def test_gone_gpu_xid_maps_through_the_remembered_address() -> None:
    store, ingest = setup()
    feed(ingest, store, snap(T0 + 1))  # removed: NVML no longer lists it
    ingest.apply(rec(1, xid_line(79, rest="GPU has fallen off the bus.")), T0 + 2)
    assert store.xid_counts == {(UUID, 79): 1}
    assert ingest.addresses == {BUS: UUID}


def test_log_uuid_maps_a_gpu_nvml_never_listed() -> None:
    store = Store()
    ingest = KernelLogIngest(store)
    ingest.apply(rec(1, "NVRM: GPU at PCI:0000:3b:00: GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a"), T0)
    ingest.apply(rec(2, xid_line(48, "0000:3b:00")), T0)
    ingest.apply(rec(3, xid_line(13, "0000:99:00")), T0)
    assert store.xid_counts == {("GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a", 48): 1, ("unknown", 13): 1}
    conds = xid.conditions(store, T0 + 1, RulesConfig())
    assert {(c.labels["uuid"], c.labels["xid"], c.severity) for c in conds} == {
        ("GPU-9fe1319c-8dd3-44e4-2b74-de93f8b02c6a", "48", "critical"), ("unknown", "13", "warning")}


def test_aer_on_the_upstream_port_counts_for_the_gpu_below_it() -> None:
    store = Store()
    tree = {BUS: ["00000000:00:1C.0", "00000000:02:00.0", "00000000:03:01.0"],
            "00000000:41:00.0": ["00000000:00:01.0"]}
    ingest = KernelLogIngest(store, topology=lambda a: tree.get(a, []))
    feed(ingest, store, snap(T0, gpu(), gpu(OTHER, "00000000:41:00.0", 1)))
    ingest.apply(rec(1, "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0"), T0)
    ingest.apply(rec(2, "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:41:00.0"), T0)
    ingest.apply(rec(3, "pcieport 0000:00:1d.0: AER: Uncorrected (Fatal) error received: 0000:00:1d.0"), T0)
    assert ingest.stats.aer == {(UUID, "corrected"): 1, (OTHER, "nonfatal"): 1, ("unknown", "fatal"): 1}
    # the GPU is gone from sysfs later: the remembered topology still names it
    feed(ingest, store, snap(T0 + 1, gpu(OTHER, "00000000:41:00.0", 1)))
    tree.pop(BUS)
    ingest.apply(rec(4, "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0"), T0 + 2)
    assert ingest.stats.aer[(UUID, "corrected")] == 2


def test_every_line_is_counted_by_kind() -> None:
    _store, ingest = setup()
    for i, line in enumerate([
        "thunderbolt 0-1: device disconnected", "pcieport 0000:00:1c.0: pciehp: Slot(0-1): Link Down",
        "NVRM: RmInitAdapter failed! (0x22:0x56:667)", "NVRM: API mismatch: the client has the version 1.2, but",
        "usb 1-1: reset", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024",
    ]):
        ingest.apply(rec(i + 1, line), T0)
    lines = {k: v for k, v in ingest.stats.lines.items() if v}
    assert lines == {"thunderbolt": 1, "pciehp": 1, "rm_init_failed": 1, "version_mismatch": 1, "other": 1,
                     "driver_loaded": 1}
    assert ingest.stats.driver_version == "550.54.14"
    assert ingest.stats.last_seq == 6
