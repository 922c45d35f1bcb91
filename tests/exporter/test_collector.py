"""StoreCollector over hand-built stores: contract names, types, labels, None handling, lost GPUs, failures."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.gpu_families import HEALTH_ROWS, PCIE_ROWS, VALUE_ROWS
from gpuwatchd.model import GpuSample, LinkSample, ProcessSample, Snapshot
from gpuwatchd.store import Store

from .conftest import BUILD, UUID_A, UUID_B, UUID_C, UUID_D, exposition, registry_for, samples

# The public contract (docs/metrics.md, shared/design/contracts.md): name -> (type, label names).
CONTRACT = {
    "gpuwatchd_nvml_up": ("gauge", set()),
    "gpuwatchd_nvml_worker_restarts_total": ("counter", set()),
    "gpuwatchd_gpu_info": ("gauge", {"uuid", "index", "name", "pci_bus_id", "driver_version"}),
    "gpuwatchd_gpu_present": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_last_seen_timestamp_seconds": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_memory_total_bytes": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_memory_used_bytes": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_utilization_ratio": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_temperature_celsius": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_power_watts": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_energy_joules_total": ("counter", {"uuid"}),
    "gpuwatchd_gpu_clock_hertz": ("gauge", {"uuid", "clock"}),
    "gpuwatchd_gpu_clocks_event_active": ("gauge", {"uuid", "reason"}),
    "gpuwatchd_gpu_pcie_link_generation": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_pcie_link_max_generation": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_pcie_link_width": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_pcie_link_max_width": ("gauge", {"uuid"}),
    "gpuwatchd_gpu_process_memory_used_bytes": ("gauge", {"uuid", "pid", "process"}),
    "gpuwatchd_gpu_xid_errors_total": ("counter", {"uuid", "xid"}),
    "gpuwatchd_source_success": ("gauge", {"source"}),
    "gpuwatchd_source_duration_seconds": ("gauge", {"source"}),
    "gpuwatchd_build_info": ("gauge", {"version", "python", "pynvml"}),
    "gpuwatchd_config_last_reload_successful": ("gauge", set()),
    "gpuwatchd_config_last_reload_success_timestamp_seconds": ("gauge", set()),
    "gpuwatchd_gpus": ("gauge", set()),
    "gpuwatchd_nvml_stale": ("gauge", set()),
}


def value(text: str, metric: str, /, **labels: str) -> float | None:
    found = [
        s.value for s in samples(text) if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{metric}{labels} matched {len(found)} samples"
    return found[0] if found else None


def test_every_contract_name_has_its_type_and_labels(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    fams = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            fams.setdefault(s.name, (fam.type, set()))[1].update(s.labels)
    for name, (kind, labels) in CONTRACT.items():
        assert name in fams, f"{name} missing from the exposition"
        assert fams[name] == (kind, labels), f"{name}: got {fams[name]}"


def test_units_are_base_units(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_gpu_clock_hertz", uuid=UUID_A, clock="sm") == 1.98e9
    assert value(text, "gpuwatchd_gpu_utilization_ratio", uuid=UUID_A) == 0.97
    assert value(text, "gpuwatchd_gpu_memory_total_bytes", uuid=UUID_A) == 85520809984
    for s in samples(text):
        if s.name.endswith("_ratio"):
            assert 0.0 <= s.value <= 1.0, s


def test_missing_reading_exports_no_sample(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    # GPU B (GeForce) has no ECC, no reserved memory, no power min/max, no replay counter: no samples, not zeros.
    for name in (
        "gpuwatchd_gpu_ecc_enabled",
        "gpuwatchd_gpu_ecc_errors_aggregate_total",
        "gpuwatchd_gpu_memory_reserved_bytes",
        "gpuwatchd_gpu_power_max_limit_watts",
        "gpuwatchd_gpu_pcie_replays_total",
        "gpuwatchd_gpu_remapped_rows",
    ):
        assert not [s for s in samples(text) if s.name == name and s.labels.get("uuid") == UUID_B], name
        assert [s for s in samples(text) if s.name == name and s.labels.get("uuid") == UUID_A], name
    # ... and the failed read is explained instead
    assert value(text, "gpuwatchd_gpu_field_error_info", uuid=UUID_B, field="power_max_limit_watts") == 1.0
    # Xorg's memory is not attributable (None): no process memory sample, but the process count still says 1.
    assert value(text, "gpuwatchd_gpu_process_memory_used_bytes", uuid=UUID_B, pid="777") is None
    assert value(text, "gpuwatchd_gpu_processes", uuid=UUID_B) == 1.0


def test_lost_and_removed_gpus_export_only_presence_identity_and_last_seen(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    allowed = {
        "gpuwatchd_gpu_present",
        "gpuwatchd_gpu_lost",
        "gpuwatchd_gpu_info",
        "gpuwatchd_gpu_last_seen_timestamp_seconds",
    }
    # no readings for a gone GPU; its event counters (events that happened, e.g. the 79 that took it) stay
    events = {"gpuwatchd_gpu_xid_errors_total", "gpuwatchd_gpu_xid_reports_total", "gpuwatchd_gpu_fallen_off_bus_total",
              "gpuwatchd_pcie_aer_errors_total"}
    for uuid in (UUID_C, UUID_D):
        names = {s.name for s in samples(text) if s.labels.get("uuid") == uuid}
        assert names - events == allowed, uuid
        assert value(text, "gpuwatchd_gpu_present", uuid=uuid) == 0.0
    assert value(text, "gpuwatchd_gpu_present", uuid=UUID_A) == 1.0
    assert (value(text, "gpuwatchd_gpu_lost", uuid=UUID_C), value(text, "gpuwatchd_gpu_lost", uuid=UUID_D)) == (1, 0)
    assert value(text, "gpuwatchd_gpus") == 2.0
    # last seen is the last poll with readings (the first snapshot), not the poll that found it gone
    assert value(text, "gpuwatchd_gpu_last_seen_timestamp_seconds", uuid=UUID_C) == 1_700_000_000.0
    assert value(text, "gpuwatchd_gpu_info", uuid=UUID_D, name="NVIDIA RTX A4000", index="3") == 1.0


def test_a_gpu_that_comes_back_exports_values_again(mixed_store: Store) -> None:
    assert mixed_store.latest is not None
    gone = GpuSample(uuid=UUID_D, index=2, name="NVIDIA RTX A4000", memory_used_bytes=99)
    mixed_store.apply(replace(mixed_store.latest, timestamp=1_700_000_100.0, gpus=(*mixed_store.latest.gpus, gone)))
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_gpu_present", uuid=UUID_D) == 1.0
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_D) == 99.0


def test_xid_counters_per_code(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_gpu_xid_errors_total", uuid=UUID_A, xid="13") == 2.0
    assert value(text, "gpuwatchd_gpu_xid_errors_total", uuid="unknown", xid="48") == 1.0
    # The lost GPU's Xid 79 stays exported: it is the event that says why the GPU went.
    assert mixed_store.xid_counts[(UUID_C, 79)] == 1
    assert value(text, "gpuwatchd_gpu_xid_errors_total", uuid=UUID_C, xid="79") == 1.0


def test_clock_event_reasons_one_series_per_supported_reason(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    a = {s.labels["reason"]: s.value for s in samples(text)
         if s.name == "gpuwatchd_gpu_clocks_event_active" and s.labels["uuid"] == UUID_A}
    # A supports 0x7FF plus an undocumented bit 12; mask 0x0C = sw_power_cap + hw_slowdown
    assert len(a) == 12
    assert a["bit_12"] == 0.0
    assert {r for r, v in a.items() if v == 1.0} == {"sw_power_cap", "hw_slowdown"}
    b = {s.labels["reason"] for s in samples(text)
         if s.name == "gpuwatchd_gpu_clocks_event_active" and s.labels["uuid"] == UUID_B}
    assert "board_limit" not in b  # B's supported mask is 0x1FF
    assert "gpu_idle" in b


def test_clock_event_reasons_with_unknown_supported_mask_show_only_active() -> None:
    store = Store()
    g = GpuSample(uuid="GPU-x", index=0, clocks_event_reasons=0x40, clocks_event_reasons_supported=None)
    store.apply(Snapshot(timestamp=1.0, nvml_ok=True, gpus=(g,)))
    got = [(s.labels["reason"], s.value) for s in samples(exposition(store))
           if s.name == "gpuwatchd_gpu_clocks_event_active"]
    assert got == [("hw_thermal", 1.0)]


def test_duplicate_process_entries_give_one_series(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    rows = [
        s for s in samples(text) if s.name == "gpuwatchd_gpu_process_memory_used_bytes" and s.labels["pid"] == "4242"
    ]
    assert len(rows) == 1
    assert rows[0].labels == {"uuid": UUID_A, "pid": "4242", "process": "python3"}
    assert value(text, "gpuwatchd_gpu_process_host_rss_bytes", pid="4242") == 8e9


def test_before_the_first_poll_nvml_status_is_unknown_not_down() -> None:
    text = exposition(Store())
    names = {s.name for s in samples(text)}
    assert "gpuwatchd_nvml_up" not in names
    assert "gpuwatchd_gpus" not in names
    assert value(text, "gpuwatchd_nvml_worker_restarts_total") == 0.0
    assert value(text, "gpuwatchd_build_info") == 1.0


def test_nvml_down_exports_reason_and_no_gpu_values(mixed_store: Store) -> None:
    reg = registry_for(mixed_store)
    generate_latest(reg)
    mixed_store.apply(Snapshot(timestamp=1_700_000_060.0, nvml_ok=False, nvml_error="driver_not_loaded"))
    text = generate_latest(reg).decode()
    # gpu_info keeps the last known driver version: its label set (series identity) does not flap with NVML
    assert value(text, "gpuwatchd_gpu_info", uuid=UUID_A, driver_version="535.161.08") == 1.0
    assert value(text, "gpuwatchd_nvml_up") == 0.0
    assert value(text, "gpuwatchd_nvml_error_info", reason="driver_not_loaded") == 1.0
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_A) is None
    assert value(text, "gpuwatchd_gpu_info", uuid=UUID_A) == 1.0


def test_error_info_absent_while_up(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_nvml_up") == 1.0
    assert "gpuwatchd_nvml_error_info" not in {s.name for s in samples(text)}


def test_stale_poll_keeps_values_and_says_so(mixed_store: Store) -> None:
    assert value(exposition(mixed_store), "gpuwatchd_nvml_stale") == 0.0
    mixed_store.mark_stale()
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_nvml_stale") == 1.0
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_A) == 42949672960


def test_sysfs_links_in_nvml_bus_id_form(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_sysfs_pcie_link_max_generation", pci_bus_id="00000000:0C:00.0") == 4.0
    assert value(text, "gpuwatchd_sysfs_pcie_device_present", pci_bus_id="00000000:40:00.0") == 0.0
    assert value(text, "gpuwatchd_sysfs_pcie_link_width", pci_bus_id="00000000:40:00.0") is None
    mixed_store.set_links([LinkSample(pci_bus_id="weird")])
    assert value(exposition(mixed_store), "gpuwatchd_sysfs_pcie_device_present", pci_bus_id="weird") == 1.0


def test_self_metrics(mixed_store: Store) -> None:
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_source_success", source="kmsg") == 0.0
    assert value(text, "gpuwatchd_source_success", source="nvml") == 1.0
    assert value(text, "gpuwatchd_source_duration_seconds", source="sysfs") == 0.0012
    assert value(text, "gpuwatchd_config_last_reload_successful") == 0.0
    assert value(text, "gpuwatchd_nvml_worker_restarts_total") == 2.0
    assert value(text, "gpuwatchd_build_info", version="0.0.0-test") == 1.0


def test_failing_group_is_left_out_counted_and_logged_once_per_interval(
    mixed_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    collector = StoreCollector(mixed_store, build=BUILD, monotonic=lambda: now[0])
    # Corrupt the data only the clocks group reads: a clock value that is not a number makes that group raise.
    assert mixed_store.latest is not None
    a = mixed_store.latest.gpus[0]
    broken = replace(a, clocks_hz={"sm": "fast"})  # type: ignore[dict-item]
    mixed_store.apply(replace(mixed_store.latest, gpus=(broken, *mixed_store.latest.gpus[1:])))
    reg = registry_for(mixed_store, collector)
    with caplog.at_level(logging.ERROR, logger="gpuwatchd.exporter.collector"):
        text = generate_latest(reg).decode()
        generate_latest(reg)
        now[0] += 61.0
        text = generate_latest(reg).decode()
    assert value(text, "gpuwatchd_exporter_collect_errors_total", group="clocks") == 3.0
    assert value(text, "gpuwatchd_exporter_collect_errors_total", group="gpu") == 0.0
    assert "gpuwatchd_gpu_clock_hertz" not in {s.name for s in samples(text)}
    # other groups are intact, including the broken GPU's other readings
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_A) == 42949672960
    records = [r for r in caplog.records if "'clocks'" in r.getMessage()]
    assert len(records) == 2  # three failures, one log line per 60 s window
    assert records[0].exc_info is not None


def test_families_are_built_fresh_each_scrape(mixed_store: Store) -> None:
    reg = registry_for(mixed_store)
    before = generate_latest(reg).decode()
    assert mixed_store.latest is not None
    mixed_store.apply(replace(mixed_store.latest, timestamp=1_700_000_200.0, gpus=mixed_store.latest.gpus[:1]))
    after = generate_latest(reg).decode()
    assert value(before, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_B) is not None
    assert value(after, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_B) is None
    assert value(after, "gpuwatchd_gpu_present", uuid=UUID_B) == 0.0


def test_process_without_name_has_empty_process_label() -> None:
    store = Store()
    g = GpuSample(uuid="GPU-x", index=0, processes=(ProcessSample(pid=9, used_memory_bytes=1),), processes_total=1)
    store.apply(Snapshot(timestamp=1.0, nvml_ok=True, gpus=(g,)))
    text = exposition(store)
    assert value(text, "gpuwatchd_gpu_process_memory_used_bytes", pid="9") == 1.0


def _family(metrics: list[Metric], name: str) -> Metric:
    found = [m for m in metrics if m.name == name]
    assert len(found) == 1, name
    return found[0]


def test_per_gpu_families_are_built_once_per_set_of_samples(mixed_store: Store) -> None:
    collector = StoreCollector(mixed_store, build=BUILD)
    first, second = list(collector.collect()), list(collector.collect())
    # Same GpuSample objects: the per-GPU families are reused; the runtime groups are still built per scrape.
    assert _family(first, "gpuwatchd_gpu_memory_used_bytes") is _family(second, "gpuwatchd_gpu_memory_used_bytes")
    assert _family(first, "gpuwatchd_gpu_process_memory_used_bytes") is _family(
        second, "gpuwatchd_gpu_process_memory_used_bytes"
    )
    assert _family(first, "gpuwatchd_nvml_up") is not _family(second, "gpuwatchd_nvml_up")
    latest = mixed_store.latest
    assert latest is not None
    # A new poll with the very same samples (nothing read changed) still reuses them ...
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 1))
    third = list(collector.collect())
    assert _family(third, "gpuwatchd_gpu_memory_used_bytes") is _family(first, "gpuwatchd_gpu_memory_used_bytes")
    # ... and a new sample object, even for one GPU, rebuilds with its values.
    a = replace(latest.gpus[0], memory_used_bytes=123)
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 2, gpus=(a, *latest.gpus[1:])))
    fourth = list(collector.collect())
    used = _family(fourth, "gpuwatchd_gpu_memory_used_bytes")
    assert used is not _family(first, "gpuwatchd_gpu_memory_used_bytes")
    assert {s.labels["uuid"]: s.value for s in used.samples}[UUID_A] == 123.0


def test_process_families_are_reused_while_the_process_lists_and_owners_are(mixed_store: Store) -> None:
    # The decoder hands over the previous poll's process tuple for an unchanged GPU, and attribution its previous
    # owners map: new GpuSample objects around the same tuples reuse the per-process families.
    from gpuwatchd.model import Attribution, ProcessOwner

    collector = StoreCollector(mixed_store, build=BUILD)
    latest = mixed_store.latest
    assert latest is not None
    first = _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes")
    moved = tuple(replace(g, memory_used_bytes=(g.memory_used_bytes or 0) + 1) for g in latest.gpus)
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 1, gpus=moved))
    second = _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes")
    assert second is first
    # A new tuple of the same process objects is no change ...
    regrouped = tuple(replace(g, processes=tuple(list(g.processes))) for g in moved)
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 1.5, gpus=regrouped))
    assert _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes") is first
    # ... equal but new process objects are (identity, not equality, is what the decoder promises) ...
    copied = tuple(replace(g, processes=tuple(replace(p) for p in g.processes)) for g in moved)
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 2, gpus=copied))
    third = _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes")
    assert third is not first and third.samples == first.samples
    # ... and so are a new process count, a new owners map and a GPU that drops out.
    counted = tuple(replace(g, processes_total=(g.processes_total or 0) + 5) for g in copied)
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 3, gpus=counted))
    text = exposition(mixed_store)
    assert value(text, "gpuwatchd_gpu_processes", uuid=UUID_A) == (copied[0].processes_total or 0) + 5
    fourth = _family(list(collector.collect()), "gpuwatchd_gpu_processes")
    assert {s.labels["uuid"]: s.value for s in fourth.samples}[UUID_A] == (copied[0].processes_total or 0) + 5
    pid = counted[0].processes[0].pid
    owners = {(counted[0].uuid, pid): ProcessOwner(hpc_job="77")}
    mixed_store.set_attribution(Attribution(timestamp=latest.timestamp + 3, owners=owners))
    owned = _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes")
    assert any(s.labels.get("hpc_job") == "77" for s in owned.samples)
    mixed_store.set_attribution(Attribution(timestamp=latest.timestamp + 4, owners=owners))
    assert _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes") is owned
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 5, gpus=counted[:1]))
    alone = _family(list(collector.collect()), "gpuwatchd_gpu_process_memory_used_bytes")
    assert {s.labels["uuid"] for s in alone.samples} == {UUID_A}


def test_reused_families_follow_presence(mixed_store: Store) -> None:
    # The reuse is keyed on the present GPUs' samples: a GPU that drops out changes the key, not only the snapshot.
    collector = StoreCollector(mixed_store, build=BUILD)
    reg = registry_for(mixed_store, collector)
    generate_latest(reg)
    latest = mixed_store.latest
    assert latest is not None
    mixed_store.apply(replace(latest, timestamp=latest.timestamp + 1, gpus=latest.gpus[:1]))
    text = generate_latest(reg).decode()
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_A) is not None
    assert value(text, "gpuwatchd_gpu_memory_used_bytes", uuid=UUID_B) is None
    assert value(text, "gpuwatchd_gpu_present", uuid=UUID_B) == 0.0


def test_every_family_row_reads_a_model_field() -> None:
    # A misspelt field in a row would raise AttributeError at the first scrape of a GPU; catch it here instead.
    fields = {f.name for f in dataclasses.fields(GpuSample)}
    rows = (*VALUE_ROWS, *HEALTH_ROWS, *PCIE_ROWS)
    assert [r.field for r in rows if r.field not in fields] == []
    assert len({r.field for r in rows}) == len(rows)  # one row per reading


# GpuSample fields that no Row exports: identity (gpuwatchd_gpu_info, gpuwatchd_mig_device_info, the status API),
# maps and bit masks with hand-written families (clocks, NVLink, PCIe error types and lanes, GPM, processes), the
# per-poll errors. A new reading is a Row; a field added here needs a family written by hand.
NOT_ROWS = {
    "uuid", "index", "name", "pci_bus_id", "serial", "parent_uuid", "gpu_instance_id", "compute_instance_id",
    "profile", "errors",
    "clocks_hz", "max_clocks_hz", "clocks_event_reasons", "clocks_event_reasons_supported", "violation_seconds",
    "pcie_errors_total", "pcie_lane_errors_total", "processes", "processes_total",
    "nvlink_states", "nvlink_errors_total", "nvlink_transmit_bytes_total", "nvlink_receive_bytes_total",
    "recovery_action",
    "fabric_state", "fabric_status", "fabric_clique_id", "fabric_cluster_uuid", "p2p_status",  # fabric_families.py
    "gpm_graphics_activity_ratio", "gpm_sm_activity_ratio", "gpm_sm_occupancy_ratio", "gpm_tensor_activity_ratio",
    "gpm_tensor_pipe_activity_ratio", "gpm_pipe_activity_ratio", "gpm_dram_activity_ratio",
    "gpm_pcie_bytes_per_second", "gpm_nvlink_bytes_per_second",
}  # fmt: skip


def test_every_model_field_is_a_row_or_written_by_hand() -> None:
    # A field the worker fills but no family reads would be dropped silently between the model and /metrics.
    rows = {r.field for r in (*VALUE_ROWS, *HEALTH_ROWS, *PCIE_ROWS)}
    fields = {f.name for f in dataclasses.fields(GpuSample)}
    assert sorted(fields - rows - NOT_ROWS) == []
    assert sorted(NOT_ROWS - fields) == []  # no stale names
