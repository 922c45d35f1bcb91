"""Each built-in rule family, positive and negative, on store histories built from hand-made snapshots."""

from __future__ import annotations

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, LostGpu, XidEvent
from gpuwatchd.rules import xid as xid_rule
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.rules.link import replay_allowance
from gpuwatchd.store import Store

from .conftest import T0, UUID, gpu, run, snap

HW_SLOWDOWN, SW_POWER_CAP, GPU_IDLE, HW_THERMAL, SW_THERMAL, HW_POWER_BRAKE = 0x8, 0x4, 0x1, 0x40, 0x20, 0x80


def engine(**cfg: object) -> RulesEngine:
    return RulesEngine(validate(RulesConfig, cfg), host="node1")


def named(alerts: list[Alert], name: str, state: str | None = None) -> list[Alert]:
    return [a for a in alerts if a.name == name and (state is None or a.state == state)]


# -- throttle ----------------------------------------------------------------------------------------------------


def test_hw_thermal_sustained_fires_with_share_from_violation_counter(store: Store) -> None:
    eng = engine()

    def make(t: float):  # type: ignore[no-untyped-def]
        s = t - T0
        on = s >= 60
        # thermal violation counter grows 0.87 s per second while throttled
        return snap(t, gpu(clocks_event_reasons=HW_THERMAL if on else 0, temperature_celsius=88.0,
                           violation_seconds={"thermal": max(0.0, s - 60) * 0.87, "power": 0.0}))

    hist = run(store, eng, make, start=T0, end=T0 + 360, every=10)
    first = next(t for t, al in hist if named(al, "GpuThrottled", "firing"))
    # condition true from ~75 s (half of the 30 s window), then for: 60 s
    assert T0 + 120 <= first <= T0 + 150
    a = named(hist[-1][1], "GpuThrottled")[0]
    assert a.labels["reason"] == "hw_thermal" and a.severity == "warning"
    assert "HW thermal slowdown 87% of the last 5m" in a.summary and "88 °C" in a.summary
    assert a.annotations["share_source"] == "thermal violation counter"


def test_flickering_reason_counts_by_share(store: Store) -> None:
    eng = engine()

    def make(t: float):  # type: ignore[no-untyped-def]
        on = int((t - T0) / 5) % 3 != 2  # active 2 of every 3 samples
        return snap(t, gpu(clocks_event_reasons=HW_SLOWDOWN if on else GPU_IDLE))

    hist = run(store, eng, make, start=T0, end=T0 + 300, every=15)
    a = named(hist[-1][1], "GpuThrottled", "firing")
    assert a and a[0].labels["reason"] == "hw_slowdown"
    assert "samples" in a[0].annotations["share_source"]  # no counter for hw_slowdown


def test_single_sample_and_harmless_reasons_do_not_fire(store: Store) -> None:
    eng = engine()

    def make(t: float):  # type: ignore[no-untyped-def]
        s = t - T0
        mask = GPU_IDLE | 0x2 | 0x10 | 0x100  # idle, app clocks, sync boost, display
        if s == 100:
            mask |= HW_SLOWDOWN  # one sample
        return snap(t, gpu(clocks_event_reasons=mask))

    hist = run(store, eng, make, start=T0, end=T0 + 600, every=5)
    assert not [a for _, al in hist for a in named(al, "GpuThrottled")]


def test_sw_power_cap_only_when_configured_and_busy() -> None:
    def scenario(util: float, enabled: bool) -> list[Alert]:
        store = Store()
        eng = engine(throttle={"sw_power_cap": enabled})
        hist = run(store, eng, lambda t: snap(t, gpu(clocks_event_reasons=SW_POWER_CAP, utilization_gpu_ratio=util)),
                   start=T0, end=T0 + 300, every=15)
        return named(hist[-1][1], "GpuThrottled", "firing")

    assert scenario(0.95, enabled=False) == []
    assert scenario(0.02, enabled=True) == []  # capture xml08: sw_power_cap active at idle
    fired = scenario(0.95, enabled=True)
    assert fired and fired[0].labels["reason"] == "sw_power_cap"


def test_throttle_resolves_when_reason_clears(store: Store) -> None:
    eng = engine()
    hist = run(store, eng, lambda t: snap(t, gpu(clocks_event_reasons=HW_POWER_BRAKE if t - T0 < 300 else 0)),
               start=T0, end=T0 + 420, every=15)
    assert named(hist[-1][1], "GpuThrottled", "resolved")


# -- Xid ---------------------------------------------------------------------------------------------------------


def test_xid_severity_table() -> None:
    app = (13, 31, 43, 45, 68, 94)
    assert {c: xid_rule.severity(c) for c in app} == dict.fromkeys(app, "warning")
    assert all(xid_rule.severity(c) == "critical" for c in (62, 64, 95, 109, 119, 120, 140, 48, 74, 79))
    assert all(xid_rule.severity(c) == "info" for c in (63, 92, 154))
    assert xid_rule.severity(12345) == "warning"


def test_xid_fires_at_once_counts_repeats_and_resolves_after_quiet(store: Store) -> None:
    eng = engine(xid={"resolve_after": "10m"})
    store.apply(snap(T0, gpu(), xid_events=(XidEvent(UUID, 79, T0),)))
    # Xid 79 is held xid_rule.FALLEN_OFF_HOLD_SECONDS for GpuLost to speak for it; the GPU here never goes away.
    assert named(eng.evaluate(store, T0), "GpuXidError")[0].state == "pending"
    a = named(eng.evaluate(store, T0 + xid_rule.FALLEN_OFF_HOLD_SECONDS), "GpuXidError")[0]
    assert a.state == "firing" and a.severity == "critical" and a.labels["xid"] == "79"
    assert "GPU_HAS_FALLEN_OFF_THE_BUS" in a.summary and "Reboot" in a.annotations["action"] and "once" in a.summary
    store.apply(snap(T0 + 300, gpu(), xid_events=(XidEvent(UUID, 79, T0 + 300),)))
    a2 = named(eng.evaluate(store, T0 + 301), "GpuXidError")[0]
    assert a2.active_at == T0 and a2.value == 2.0 and "2 times" in a2.summary
    assert named(eng.evaluate(store, T0 + 300 + 599), "GpuXidError")[0].state == "firing"
    assert named(eng.evaluate(store, T0 + 300 + 601), "GpuXidError")[0].state == "resolved"


def test_reset_class_xid_clears_when_the_gpu_comes_back_but_app_xid_stays(store: Store) -> None:
    # eGPU: Xid 79 then the GPU is gone; replugged (same UUID, new index) it has had the re-plug the Xid asked
    # for, so the critical alert resolves with a reason. An application Xid (13) is not cleared by a re-plug.
    eng = engine()
    store.apply(snap(T0, gpu(), xid_events=(XidEvent(UUID, 79, T0), XidEvent(UUID, 13, T0))))
    eng.evaluate(store, T0)
    held = eng.evaluate(store, T0 + xid_rule.FALLEN_OFF_HOLD_SECONDS)
    fired = {a.labels["xid"]: a for a in named(held, "GpuXidError")}
    assert fired["79"].state == "firing" and fired["13"].state == "firing"
    store.apply(snap(T0 + 30))  # gone from enumeration
    eng.evaluate(store, T0 + 30)
    store.apply(snap(T0 + 90, gpu(index=1)))  # back at another index
    after = {a.labels["xid"]: a for a in named(eng.evaluate(store, T0 + 90), "GpuXidError")}
    assert after["79"].state == "resolved" and "re-attached or reset" in after["79"].summary
    assert after["79"].labels["gpu"] == "0"  # identity kept across the index change
    assert after["13"].state == "firing"


def test_xid_on_a_gpu_that_never_went_away_is_not_cleared(store: Store) -> None:
    eng = engine()
    store.apply(snap(T0, gpu()))
    store.apply(snap(T0 + 10, gpu(), xid_events=(XidEvent(UUID, 48, T0 + 10),)))
    eng.evaluate(store, T0 + 10)
    store.apply(snap(T0 + 60, gpu()))
    assert named(eng.evaluate(store, T0 + 60), "GpuXidError")[0].state == "firing"


def test_xid_per_code_and_kmsg_by_pci_bus_id(store: Store) -> None:
    eng = engine()
    store.apply(snap(T0, gpu()))
    store.add_xid(XidEvent(None, 94, T0 + 1, source="kmsg", pci_bus_id="PCI:0000:0c:00",
                           message="Contained: SM (0x1). RST: No, D-RST: No"))
    store.add_xid(XidEvent(None, 31, T0 + 2, source="kmsg", pci_bus_id="0000:99:00"))
    store.add_xid(XidEvent(UUID, 63, T0 + 3))
    alerts = named(eng.evaluate(store, T0 + 5), "GpuXidError")
    by = {a.labels["xid"]: a for a in alerts}
    assert set(by) == {"94", "31", "63"}
    assert by["94"].labels["uuid"] == UUID and by["94"].labels["gpu"] == "0" and by["94"].severity == "warning"
    assert "Contained: SM" in by["94"].summary and by["94"].annotations["source"] == "kmsg"
    assert by["31"].labels["uuid"] == "unknown" and "PCI 0000:99:00" in by["31"].summary
    assert by["63"].severity == "info"


def test_xid_ignore_list(store: Store) -> None:
    eng = engine(xid={"ignore": [43]})
    store.apply(snap(T0, gpu(), xid_events=(XidEvent(UUID, 43, T0),)))
    assert named(eng.evaluate(store, T0), "GpuXidError") == []


# -- ECC ---------------------------------------------------------------------------------------------------------


def test_ecc_conditions(store: Store) -> None:
    eng = engine()
    store.apply(snap(T0, gpu(ecc_uncorrected_volatile=2, retired_pages_sbe=60, retired_pages_dbe=3,
                             remapped_rows_pending=True, remapped_rows_uncorrectable=4),
                     gpu(uuid="GPU-b", index=1, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=3,
                         retired_pages_sbe=2, retired_pages_pending=True, remapped_rows_failure=True)))
    alerts = named(eng.evaluate(store, T0), "GpuEccError", "firing")
    kinds = {(a.labels["gpu"], a.labels["kind"]): a.severity for a in alerts}
    assert kinds == {
        ("0", "dbe_volatile"): "critical",
        ("0", "retired_pages"): "critical",
        ("0", "row_remap_pending"): "warning",
        ("1", "retired_pages_pending"): "warning",
        ("1", "row_remap_failed"): "critical",
    }
    assert any("4 uncorrectable rows" in a.summary for a in alerts)


def test_healthy_ecc_is_silent(store: Store) -> None:
    store.apply(snap(T0, gpu(ecc_uncorrected_volatile=0, ecc_corrected_aggregate=3, retired_pages_sbe=62,
                             retired_pages_dbe=0, retired_pages_pending=False, remapped_rows_pending=False)))
    assert named(engine().evaluate(store, T0), "GpuEccError") == []


# -- PCIe --------------------------------------------------------------------------------------------------------


def test_link_degraded_only_while_busy(store: Store) -> None:
    eng = engine()

    def make(t: float):  # type: ignore[no-untyped-def]
        busy = t - T0 >= 300
        # idle: gen1 x16 (legitimate downshift); busy: stuck at gen3 x8 of gen4 x16
        return snap(t, gpu(utilization_gpu_ratio=0.95 if busy else 0.0,
                           pcie_link_generation=3 if busy else 1, pcie_link_width=8 if busy else 16))

    hist = run(store, eng, make, start=T0, end=T0 + 600, every=15)
    assert not [a for t, al in hist if t < T0 + 300 for a in named(al, "GpuPcieLinkDegraded")]
    fired = [(t, a) for t, al in hist for a in named(al, "GpuPcieLinkDegraded", "firing")]
    assert fired and fired[0][0] >= T0 + 300 + 120
    assert "gen3 x8 of gen4 x16 while 95% busy" in fired[0][1].summary


def test_replay_allowance_matches_dcgm() -> None:
    assert replay_allowance(4, 16, 60) == 16  # dcgm.md §2.1: Gen4 x16 allows 16/min
    assert replay_allowance(3, 4, 60) == 2  # Gen3 x4 (Thunderbolt eGPU) allows 2/min


def test_replays_above_rate_fire_and_below_do_not() -> None:
    def scenario(per_minute: float) -> list[Alert]:
        store = Store()
        eng = engine()
        hist = run(store, eng, lambda t: snap(t, gpu(pcie_link_generation=3, pcie_link_width=4,
                                                     pcie_replay_total=int((t - T0) * per_minute / 60))),
                   start=T0, end=T0 + 180, every=15)
        return named(hist[-1][1], "GpuPcieReplays", "firing")

    assert scenario(1.0) == []
    fired = scenario(30.0)
    assert fired and "allows 2/min" in fired[0].summary


# -- presence ----------------------------------------------------------------------------------------------------


def test_lost_then_back(store: Store) -> None:
    eng = engine()
    store.apply(snap(T0, gpu()))
    assert eng.evaluate(store, T0) == []
    store.apply(snap(T0 + 5, lost=(LostGpu(index=0, uuid=UUID),)))
    a = named(eng.evaluate(store, T0 + 5), "GpuLost")[0]
    assert a.state == "firing" and a.severity == "critical" and a.labels["gpu"] == "0"
    assert "lost (fell off the bus)" in a.summary
    store.apply(snap(T0 + 10, gpu()))
    r = named(eng.evaluate(store, T0 + 10), "GpuLost")[0]
    assert r.state == "resolved" and "is back since" in r.summary and "now at index 0" in r.summary


def test_egpu_removed_then_reattached_at_another_index(store: Store) -> None:
    eng = engine(expected_gpu_count=2)
    other = gpu(uuid="GPU-other", index=0, name="NVIDIA RTX A5000")
    store.apply(snap(T0, other, gpu(index=1)))
    assert eng.evaluate(store, T0) == []
    store.apply(snap(T0 + 5, other))  # dock unplugged: gone from enumeration
    alerts = eng.evaluate(store, T0 + 5)
    rem = named(alerts, "GpuRemoved")[0]
    assert rem.state == "firing" and rem.severity == "warning" and rem.labels["gpu"] == "1"
    assert "removed (no longer enumerated)" in rem.summary
    assert named(alerts, "GpuCountLow", "pending") and named(alerts, "GpuLost") == []
    count = named(eng.evaluate(store, T0 + 65), "GpuCountLow")[0]
    assert count.state == "firing" and count.summary.startswith("1 of 2 expected GPUs present")
    assert "removed" in count.summary and "uuid" not in count.labels
    store.apply(snap(T0 + 70, other, gpu(index=2)))  # re-plugged; enumerates at index 2 now
    alerts = eng.evaluate(store, T0 + 70)
    r = named(alerts, "GpuRemoved")[0]
    assert r.state == "resolved" and "is back since" in r.summary and "now at index 2" in r.summary
    assert named(alerts, "GpuCountLow")[0].state == "resolved"


def test_count_check_off_without_expectation(store: Store) -> None:
    store.apply(snap(T0, gpu()))
    assert named(engine().evaluate(store, T0 + 120), "GpuCountLow") == []


def test_xid_with_unparsable_pci_id_still_alerts(store: Store) -> None:
    store.apply(snap(T0, gpu()))
    store.add_xid(XidEvent(None, 79, T0, source="kmsg", pci_bus_id="garbage"))
    a = named(engine().evaluate(store, T0 + 1), "GpuXidError")[0]
    assert a.labels["uuid"] == "unknown" and a.severity == "critical"
