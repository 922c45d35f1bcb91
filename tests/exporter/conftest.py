"""Stores built from fixture files, and the exposition helpers the exporter tests share."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.runtime_families import BuildInfo
from gpuwatchd.model import DockSample, LinkSample, SourceStatus, snapshot_from_dict
from gpuwatchd.model.kernel_log import KernelLogStats
from gpuwatchd.store import Store

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
BUILD = BuildInfo(version="0.0.0-test", python="3.x", pynvml="0.0.0")

# The four GPUs of fixtures/store_mixed.json: A and B present, C lost (GPU_IS_LOST), D removed (unplugged).
UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"
UUID_D = "GPU-dddddddd-0000-4000-8000-000000000000"


def store_from_fixture(name: str) -> Store:
    """Replay a fixture file (snapshots in order, then links, sources and runtime facts) into a fresh store."""
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    store = Store()
    for snap in data.get("snapshots", ()):
        store.apply(snapshot_from_dict(snap))
    store.set_links(LinkSample(**link) for link in data.get("links", ()))
    store.set_docks(DockSample(**{**d, "gpu_bus_ids": tuple(d["gpu_bus_ids"])}) for d in data.get("docks", ()))
    for src in data.get("sources", ()):
        store.set_source_status(SourceStatus(**src))
    store.nvml_worker_restarts = data.get("nvml_worker_restarts", 0)
    store.config_reload_success = data.get("config_reload_success", True)
    store.config_reload_timestamp = data.get("config_reload_timestamp")
    if data.get("stale"):
        store.mark_stale()
    if (kl := data.get("kernel_log")) is not None:
        store.kernel_log = KernelLogStats(
            up=kl["up"], lines=dict(kl["lines"]), records_lost=kl["records_lost"],
            fallen_off_bus={u: n for u, n in kl["fallen_off_bus"]},
            aer={(u, sev): n for u, sev, n in kl["aer"]},
            xid_reports={(u, x, src): n for u, x, src, n in kl["xid_reports"]},
        )
    return store


def registry_for(store: Store, collector: StoreCollector | None = None) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(collector if collector is not None else StoreCollector(store, build=BUILD))
    return reg


def exposition(store: Store) -> str:
    return generate_latest(registry_for(store)).decode()


def samples(text: str) -> list[Sample]:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on an exposition (skips when promtool is not installed)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    cmd = [promtool, "check", "metrics"]
    return subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def mixed_store() -> Store:
    return store_from_fixture("store_mixed.json")
