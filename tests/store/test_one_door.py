"""The store is a leaf and the one way in: every event enters through Store.ingest, which bumps the version when it
changed something; model and store import nothing from the layers above; nothing else bumps the version, and
nothing under rules/ touches files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuwatchd.model import (
    Attribution,
    ConfigReload,
    DockChange,
    DockSample,
    GpuLostEvent,
    GpuSample,
    HealthChange,
    KernelLogCount,
    KernelLogDriver,
    KernelLogLoss,
    KernelLogRead,
    KernelLogStarted,
    KernelLogUp,
    LinkChange,
    LinkSample,
    NvmlCounters,
    NvmlStale,
    ProbeAvailability,
    ProbeBaselineResets,
    ProbeRecord,
    ProbeResultEvent,
    ProbeSkipped,
    Snapshot,
    SourceStatus,
    StateFileSetAside,
    XidEvent,
)
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.store import Store

PACKAGE = Path(__file__).resolve().parents[2] / "gpuwatchd"
UPPER = ("sources", "probes", "rules", "notify", "exporter")
GPU_A = GpuSample("GPU-a", 0, pci_bus_id="00000000:0C:00.0")
DOCK = DockSample(unique_id="uid-1", route="0-1", domain="domain0", authorized=True, name="Core X",
                  gpu_bus_ids=("0000:0c:00.0",))
HEALTH = GpuHealth("unhealthy", "fell off the bus", "check_cable", 2.0, ("GpuLost",))


def with_gpu() -> Store:
    store = Store()
    store.apply(Snapshot(1.0, True, gpus=(GPU_A,)))
    return store


def test_every_event_enters_through_ingest_and_bumps_the_version() -> None:
    store = with_gpu()
    record = ProbeRecord("GPU-a", "gemm", "fail", 3.0, 1.5, errors=4, problem="4 wrong elements")
    status = SourceStatus("kernel_log", False, 0.0, 2.0, "permission denied")
    attribution = Attribution(2.0)
    link = LinkSample("0000:0c:00.0", 4, 16, 4, 16)
    events = [
        XidEvent("GPU-a", 79, 2.0, "kmsg", "0000:0c:00.0"), GpuLostEvent("GPU-a", 2.0), NvmlStale(), status,
        attribution, NvmlCounters(2, 1), LinkChange((link,)), DockChange((DOCK,)), ConfigReload(False),
        KernelLogStarted(), KernelLogRead(7, ("xid", "aer"), (KernelLogCount("aer", ("GPU-a", "corrected")),)),
        KernelLogCount("xid_reports", ("GPU-a", "79", "kmsg")),
        KernelLogCount("fallen_off_bus", ("GPU-a",)), KernelLogCount("aer", ("GPU-a", "fatal")),
        KernelLogDriver(version="550.54.14"), KernelLogUp(True), KernelLogLoss(lost=2, cut=1),
        StateFileSetAside("kernel_log"), HealthChange({"GPU-a": HEALTH}),
        ProbeAvailability(False, "no_torch"),
        ProbeSkipped("GPU-a", "busy_process", 2.5), ProbeResultEvent((record,)), ProbeBaselineResets(1),
    ]
    for ev in events:
        v = store.version
        assert store.ingest(ev) is True, ev
        assert store.version == v + 1, ev
    assert store.xid_counts == {("GPU-a", 79): 1}
    assert store.presence["GPU-a"].state == "lost" and store.presence["GPU-a"].since == 2.0
    assert store.stale
    assert store.sources["kernel_log"] is status
    assert store.attribution is attribution
    assert (store.nvml_worker_restarts, store.nvml_init_failures) == (2, 1)
    assert store.links == {"0000:0c:00.0": link}
    assert store.docks == (DOCK,)
    assert store.config_reload_success is False
    stats = store.kernel_log
    assert stats is not None
    assert (stats.last_seq, stats.lines["xid"], stats.lines["aer"]) == (7, 1, 1)
    assert stats.xid_reports == {("GPU-a", "79", "kmsg"): 1}
    assert (stats.fallen_off_bus, stats.aer) == ({"GPU-a": 1}, {("GPU-a", "corrected"): 1, ("GPU-a", "fatal"): 1})
    assert (stats.driver_version, stats.up, stats.records_lost, stats.records_cut) == ("550.54.14", True, 2, 1)
    assert store.state_files_set_aside == {"kernel_log": 1}
    assert store.health == {"GPU-a": HEALTH}
    led = store.probes
    assert (led.available, led.unavailable_reason) == (False, "no_torch")
    assert led.skipped[("GPU-a", "busy_process")] == 1
    assert led.last[("GPU-a", "gemm")] is record and led.verdicts["GPU-a"].verdict == "FAILED"
    assert led.baseline_resets == 1


def test_an_event_that_changes_nothing_leaves_the_version() -> None:
    store = with_gpu()
    assert store.ingest(GpuLostEvent("GPU-a", 5.0))
    v = store.version
    assert store.ingest(GpuLostEvent("GPU-a", 6.0)) is False  # already lost since before
    assert store.ingest(GpuLostEvent("GPU-never-seen", 6.0)) is False  # nothing to name
    assert store.version == v
    store.ingest(ProbeAvailability(True, None))
    store.ingest(HealthChange({"GPU-a": HEALTH}))
    v = store.version
    assert store.ingest(ProbeAvailability(True, None)) is False
    assert store.ingest(HealthChange({"GPU-a": HEALTH})) is False  # the same assessment again
    assert store.version == v


def test_a_config_reload_failure_keeps_the_last_success_time() -> None:
    store = Store()
    store.ingest(ConfigReload(True, 10.0))
    store.ingest(ConfigReload(False))
    assert (store.config_reload_success, store.config_reload_timestamp) == (False, 10.0)


def test_something_that_is_no_event_is_refused() -> None:
    with pytest.raises(TypeError, match="not an event the store knows: GpuSample"):
        Store().ingest(GPU_A)  # type: ignore[arg-type]


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("layer", ["model", "store"])
def test_model_and_store_are_leaves(layer: str) -> None:
    back = {f"{p.relative_to(PACKAGE)}: {m}" for p in sorted((PACKAGE / layer).rglob("*.py"))
            for m in _imports(p) if m.split(".")[:2] in (["gpuwatchd", u] for u in UPPER)}
    assert not back


def test_only_the_store_bumps_its_version() -> None:
    writers = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
               if p.relative_to(PACKAGE).parts[0] != "store" and "store.version +=" in p.read_text(encoding="utf-8")]
    assert not writers


def test_rules_touch_no_files() -> None:
    io = {"os", "pathlib", "shutil", "tempfile", "gpuwatchd.state_files"}
    users = {f"{p.name}: {m}" for p in sorted((PACKAGE / "rules").rglob("*.py")) for m in _imports(p) if m in io}
    assert not users


def test_only_the_store_writes_its_counters() -> None:
    """The kernel log's counters and the series limit's drops change only through Store.ingest: no module outside
    store/ assigns to them or counts into them with series_cap.bump."""
    written = set()
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE)
        if rel.parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for target in (t for t in targets if not isinstance(t, ast.Name)):  # a local name writes nothing
                text = ast.unparse(target)
                if "series_dropped" in text or "kernel_log." in text or (rel.parts[:2] == ("sources", "kmsg")
                                                                         and "stats" in text):
                    written.add(f"{rel}: {text}")
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("bump") and rel.name != "series_cap.py":
                written.add(f"{rel}: {ast.unparse(node)}")
    assert not written
