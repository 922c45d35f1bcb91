"""Store semantics: presence transitions, history resolution and retention, process-ring expiry, Xid counts, version."""

from __future__ import annotations

from gpuwatchd.model import (
    HANG_SUSPECTED,
    HUNG,
    GpuPresence,
    GpuSample,
    LinkSample,
    LostGpu,
    ProcessSample,
    Snapshot,
    SourceStatus,
    XidEvent,
)
from gpuwatchd.store import GpuPoint, ProcessPoint, Store

T0 = 1_700_000_000.0


def gpu(uuid: str = "GPU-a", index: int = 0, procs: dict[int, int | None] | None = None, **kw: object) -> GpuSample:
    processes = tuple(ProcessSample(pid=p, used_memory_bytes=m, host_rss_bytes=4096) for p, m in (procs or {}).items())
    return GpuSample(uuid=uuid, index=index, name="NVIDIA A100", pci_bus_id=f"00000000:0{index}:00.0",
                     serial=f"S{index}", processes=processes, **kw)  # type: ignore[arg-type]


def snap(t: float, *gpus: GpuSample, lost: tuple[LostGpu, ...] = (), ok: bool = True,
         xids: tuple[XidEvent, ...] = ()) -> Snapshot:
    return Snapshot(timestamp=t, nvml_ok=ok, gpus=gpus, lost=lost, xid_events=xids)


def test_suspected_hang_holds_the_last_readings_and_presence() -> None:
    s = Store()
    s.apply(snap(T0, gpu(), gpu(uuid="GPU-b", index=1)))
    held = s.gpu("GPU-b")
    suspected = (LostGpu(index=1, uuid="GPU-b", reason=HANG_SUSPECTED),)
    s.apply(snap(T0 + 1, gpu(), lost=suspected))
    s.apply(snap(T0 + 2, gpu(), lost=suspected))
    # a guess is not a loss: still present, its last readings held (and aging), not refreshed into history
    p = s.presence["GPU-b"]
    assert (p.state, p.last_seen) == ("present", T0)
    assert s.gpu("GPU-b") is held and [g.uuid for g in s.latest.gpus] == ["GPU-a", "GPU-b"]  # type: ignore[union-attr]
    assert [pt.t for pt in s.gpu_history("GPU-b")] == [T0]
    # confirmed: lost since then, with the last readings' time
    s.apply(snap(T0 + 3, gpu(), lost=(LostGpu(index=1, uuid="GPU-b", reason=HUNG),)))
    p = s.presence["GPU-b"]
    assert (p.state, p.last_seen, p.since) == ("lost", T0, T0 + 3)
    assert s.gpu("GPU-b") is None


def test_presence_present_lost_removed_present() -> None:
    s = Store()
    s.apply(snap(T0, gpu()))
    assert s.presence["GPU-a"] == GpuPresence(s.presence["GPU-a"].identity, "present", T0, T0, T0)
    s.apply(snap(T0 + 1, gpu()))
    p = s.presence["GPU-a"]
    assert (p.state, p.last_seen, p.since, p.first_seen) == ("present", T0 + 1, T0, T0)
    # lost: keeps its identity and last_seen, since = when it went lost
    s.apply(snap(T0 + 2, lost=(LostGpu(index=0, uuid="GPU-a"),)))
    p = s.presence["GPU-a"]
    assert (p.state, p.last_seen, p.since, p.first_seen) == ("lost", T0 + 1, T0 + 2, T0)
    assert p.identity.name == "NVIDIA A100" and p.identity.serial == "S0"
    s.apply(snap(T0 + 3, lost=(LostGpu(index=0, uuid="GPU-a"),)))
    assert s.presence["GPU-a"].since == T0 + 2  # still lost: since does not move
    # removed: gone from a successful enumeration
    s.apply(snap(T0 + 4))
    p = s.presence["GPU-a"]
    assert (p.state, p.last_seen, p.since, p.first_seen) == ("removed", T0 + 1, T0 + 4, T0)
    s.apply(snap(T0 + 5))
    assert s.presence["GPU-a"].since == T0 + 4
    # back: present again with a new since, the original first_seen
    s.apply(snap(T0 + 6, gpu(index=2)))
    p = s.presence["GPU-a"]
    assert (p.state, p.last_seen, p.since, p.first_seen) == ("present", T0 + 6, T0 + 6, T0)
    assert p.identity.index == 2 and s.gpu("GPU-a") is not None and s.gpu("GPU-b") is None


def test_failed_enumeration_removes_nothing() -> None:
    s = Store()
    s.apply(snap(T0, gpu("GPU-a"), gpu("GPU-b", 1)))
    s.apply(snap(T0 + 1, ok=False))
    assert {u: p.state for u, p in s.presence.items()} == {"GPU-a": "present", "GPU-b": "present"}
    s.apply(snap(T0 + 2, gpu("GPU-b", 1), lost=(LostGpu(index=0, uuid=None),)))
    assert {u: p.state for u, p in s.presence.items()} == {"GPU-a": "removed", "GPU-b": "present"}


def test_lost_gpu_never_seen_gets_identity_from_lost_record() -> None:
    s = Store()
    s.apply(snap(T0, lost=(LostGpu(index=3, uuid="GPU-z", pci_bus_id="00000000:0C:00.0"),)))
    p = s.presence["GPU-z"]
    assert (p.state, p.last_seen, p.since, p.first_seen) == ("lost", T0, T0, T0)
    assert (p.identity.index, p.identity.pci_bus_id, p.identity.name) == (3, "00000000:0C:00.0", None)


def test_history_step_keeps_first_of_each_bucket_and_newest() -> None:
    s = Store(retention_seconds=100.0, step_seconds=5.0)
    for i in range(13):  # one poll a second for 12 s
        s.apply(snap(T0 + i, gpu(memory_used_bytes=i, procs={1: i})))
    ts = [p.t - T0 for p in s.gpu_history("GPU-a")]
    # The kept points are at least ``step`` apart from their second neighbour; the newest always replaces the
    # previous newest: 0, then 4 (replaced up to 5 - 0 >= step), then 8, then the newest 12.
    assert ts == [0, 4, 8, 12]
    assert [p.used_memory_bytes for p in s.process_history("GPU-a", 1)] == [0, 4, 8, 12]
    last = s.gpu_history("GPU-a")[-1]
    assert isinstance(last, GpuPoint) and last.memory_used_bytes == 12


def test_gpu_history_since_is_the_newest_points_from_that_time() -> None:
    s = Store(retention_seconds=100.0, step_seconds=5.0)
    for i in range(13):
        s.apply(snap(T0 + i, gpu(memory_used_bytes=i)))
    whole = s.gpu_history("GPU-a")  # t = 0, 4, 8, 12
    for since in (-1, 0, 3, 4, 8.5, 12, 13):
        assert list(s.gpu_history("GPU-a", since=T0 + since)) == [p for p in whole if p.t >= T0 + since], since
    assert s.gpu_history("GPU-b", since=T0) == ()


def test_gpu_point_fields() -> None:
    s = Store()
    s.apply(snap(T0, gpu(procs={1: 100, 2: None, 3: 50}, memory_total_bytes=1000, utilization_gpu_ratio=0.5,
                        temperature_celsius=60.0, power_watts=200.0, clocks_event_reasons=4,
                        violation_seconds={"power": 1.5}, pcie_link_generation=4, pcie_link_width=16,
                        pcie_replay_total=2)))
    (p,) = s.gpu_history("GPU-a")
    assert p == GpuPoint(T0, None, 1000, 150, 0.5, 60.0, 200.0, 4, {"power": 1.5}, 4, 16, 2)
    s.apply(snap(T0 + 10, gpu()))  # no processes, processes_total unknown: no reading
    assert s.gpu_history("GPU-a")[-1].processes_memory_bytes is None
    s.apply(snap(T0 + 20, gpu(processes_total=0)))  # known to be none: zero
    assert s.gpu_history("GPU-a")[-1].processes_memory_bytes == 0
    assert s.process_history("GPU-a", 1) == (ProcessPoint(T0, 100, 4096),)


def test_history_retention_drops_old_points() -> None:
    s = Store(retention_seconds=30.0, step_seconds=5.0)
    for i in range(0, 101, 5):
        s.apply(snap(T0 + i, gpu(procs={1: i})))
    ts = [p.t - T0 for p in s.gpu_history("GPU-a")]
    assert ts == [70, 75, 80, 85, 90, 95, 100]
    assert [p.t - T0 for p in s.process_history("GPU-a", 1)] == ts


def test_process_rings_expire_after_retention() -> None:
    s = Store(retention_seconds=30.0, step_seconds=5.0)
    s.apply(snap(T0, gpu(procs={1: 10, 2: 20})))
    s.apply(snap(T0 + 1, gpu(procs={2: 20})))  # pid 1 exited
    for i in range(2, 31):
        s.apply(snap(T0 + i, gpu(procs={2: 20})))
    assert set(s.process_keys()) == {("GPU-a", 1), ("GPU-a", 2)}  # last point at T0 == horizon: kept
    s.apply(snap(T0 + 30.5, gpu(procs={2: 20})))
    assert s.process_keys() == (("GPU-a", 2),)
    assert s.process_history("GPU-a", 1) == ()
    # a pid coming back later starts a fresh ring
    s.apply(snap(T0 + 40, gpu(procs={1: 99, 2: 20})))
    assert s.process_history("GPU-a", 1) == (ProcessPoint(T0 + 40, 99, 4096),)


def test_process_rings_expire_even_when_polls_are_rare() -> None:
    # A poll gap longer than the retention: everything not in the new poll goes at once.
    s = Store(retention_seconds=30.0, step_seconds=5.0)
    s.apply(snap(T0, gpu(procs={1: 1, 2: 2, 3: 3})))
    s.apply(snap(T0 + 100, gpu(procs={3: 3})))
    assert s.process_keys() == (("GPU-a", 3),)


def test_gpu_history_expires_for_a_removed_gpu() -> None:
    s = Store(retention_seconds=30.0, step_seconds=5.0)
    s.apply(snap(T0, gpu("GPU-a"), gpu("GPU-b", 1, procs={5: 1})))
    s.apply(snap(T0 + 10, gpu("GPU-a")))
    assert len(s.gpu_history("GPU-b")) == 1
    s.apply(snap(T0 + 41, gpu("GPU-a")))
    assert s.gpu_history("GPU-b") == () and s.process_keys() == ()
    assert s.presence["GPU-b"].state == "removed"  # presence is kept after history goes


def test_process_keys_follow_first_sight_order() -> None:
    s = Store()
    s.apply(snap(T0, gpu(procs={3: 1, 1: 1}), gpu("GPU-b", 1, procs={2: 1})))
    s.apply(snap(T0 + 1, gpu(procs={1: 1, 9: 1, 3: 1}), gpu("GPU-b", 1, procs={2: 1})))
    assert s.process_keys() == (("GPU-a", 3), ("GPU-a", 1), ("GPU-b", 2), ("GPU-a", 9))


def test_xid_counts_from_snapshots_and_kernel_log() -> None:
    s = Store()
    e1 = XidEvent(uuid="GPU-a", xid=79, timestamp=T0)
    e2 = XidEvent(uuid=None, xid=48, timestamp=T0, source="kmsg")
    s.apply(snap(T0, gpu(), xids=(e1, e1)))
    s.add_xid(e2)
    s.apply(snap(T0 + 1, gpu(), ok=False, xids=(e1,)))
    assert s.xid_counts == {("GPU-a", 79): 3, ("unknown", 48): 1}
    assert list(s.recent_xids) == [e1, e1, e2, e1]


def test_version_bumps_on_every_write() -> None:
    s = Store()
    v = [s.version]
    s.apply(snap(T0, gpu()))
    v.append(s.version)
    s.mark_stale()
    assert s.stale
    v.append(s.version)
    s.apply(snap(T0 + 1, gpu()))
    assert not s.stale and s.latest is not None and s.latest.timestamp == T0 + 1
    v.append(s.version)
    s.add_xid(XidEvent(uuid=None, xid=13, timestamp=T0))
    v.append(s.version)
    s.set_source_status(SourceStatus("sysfs", True, 0.001, T0))
    v.append(s.version)
    s.set_links([LinkSample("0000:0c:00.0", 4, 4, 16, 16)])
    v.append(s.version)
    assert v == sorted(set(v)) and len(v) == 7
    assert s.sources["sysfs"].success and s.links["0000:0c:00.0"].current_width == 16


def test_process_expiry_exact_when_the_clock_goes_backwards() -> None:
    s = Store(retention_seconds=30.0, step_seconds=5.0)
    s.apply(snap(T0 + 100, gpu(procs={1: 1})))
    s.apply(snap(T0, gpu(procs={2: 2})))  # replayed / stepped clock: pid 2 is now the older ring
    assert set(s.process_keys()) == {("GPU-a", 1), ("GPU-a", 2)}
    s.apply(snap(T0 + 31, gpu(procs={3: 3})))  # horizon T0 + 1: pid 2's ring (newest point T0) goes, pid 1 stays
    assert set(s.process_keys()) == {("GPU-a", 1), ("GPU-a", 3)}
    s.apply(snap(T0 + 131, gpu()))
    assert s.process_keys() == ()
