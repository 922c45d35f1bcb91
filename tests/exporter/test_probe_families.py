"""The probe families for a fixed probe ledger: exact exposition (golden), and promtool accepts it."""

from __future__ import annotations

import os

from prometheus_client import generate_latest

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.model.probes import ProbeRecord
from gpuwatchd.store import Store

from .conftest import BUILD, GOLDEN, promtool_check, registry_for

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"
T = 1_700_000_000.0


def ledger_store() -> Store:
    store = Store()
    led = store.probes
    led.set_available(True, None)
    led.record([
        ProbeRecord(A, "gemm", "fail", T, 1.5, 3, "3 of 16,777,216 float32 elements differ",
                    {"gemm.flops_float32": 3.1e13, "gemm.flops_bfloat16": 1.2e14}, {"gemm.flops_float32": 0.99}),
        ProbeRecord(A, "memory", "pass", T, 2.0, 0, None, {"memory.d2d": 8.1e11}, {"memory.d2d": 1.01}),
        ProbeRecord(A, "pcie", "degraded", T, 0.5, 0, None, {"pcie.h2d": 1.1e9, "pcie.d2h": 2.9e9},
                    {"pcie.h2d": 0.4, "pcie.d2h": 0.98}, {"pcie.h2d": "H2D 1.1 GB/s"}),
        ProbeRecord(A, "launch", "pass", T, 0.01, 0, None, {"launch.latency": 8e-6}, {"launch.latency": 1.0}),
    ])
    led.record([ProbeRecord(B, "worker", "timeout", T, 120.0, problem="did not finish")])
    led.skip(B, "busy_process", T)
    return store


def test_probe_exposition_matches_golden() -> None:
    store = ledger_store()
    text = generate_latest(registry_for(store, StoreCollector(store, build=BUILD))).decode()
    got = "".join(ln + "\n" for ln in text.splitlines() if "gpuwatchd_probe_" in ln)
    path = GOLDEN / "probe_metrics.prom"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), "probe exposition changed; UPDATE_GOLDEN=1 regenerates it (review the diff)"
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unavailable_reason_and_nothing_before_the_check() -> None:
    store = Store()
    text = generate_latest(registry_for(store, StoreCollector(store, build=BUILD))).decode()
    assert "gpuwatchd_probe_available" not in text  # unknown is never exported as 0
    store.probes.set_available(False, "torch_without_cuda")
    text = generate_latest(registry_for(store, StoreCollector(store, build=BUILD))).decode()
    assert "gpuwatchd_probe_available 0.0" in text
    assert 'gpuwatchd_probe_unavailable_info{reason="torch_without_cuda"} 1.0' in text
