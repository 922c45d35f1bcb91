"""dashboards/gpuwatchd.rules.yml: valid for promtool, behaves as its unit tests say, uses only exported names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import GOLDEN

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "gpuwatchd.rules.yml"
RULES_TEST = Path(__file__).parent / "rules_test.yml"
CONTRACT_ALERTS = {
    "GpuMemoryLeak", "GpuThrottled", "GpuXidError", "GpuEccError", "GpuPcieLinkDegraded", "GpuPcieReplays",
    "GpuLost", "GpuRemoved", "GpuCountLow", "GpuTemperatureHigh", "GpuDockUnauthorized", "GpuDockLinkDegraded",
}
CONTRACT_ALERTS |= {"GpuNvlinkErrors", "GpuRecoveryActionRequired"}  # issue 10
# Issue 18: the Prometheus-side trend rule is not the daemon's leak detector and does not take its name.
CONTRACT_ALERTS = (CONTRACT_ALERTS - {"GpuMemoryLeak"}) | {"GpuMemoryFillPredicted"}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def golden_names() -> set[str]:
    return {line.split()[2] for line in GOLDEN.joinpath("metrics.prom").read_text().splitlines()
            if line.startswith("# TYPE")} | {
        line.split("{")[0].split(" ")[0] for line in GOLDEN.joinpath("metrics.prom").read_text().splitlines()
        if line and not line.startswith("#")
    }


def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_rules() -> None:
    r = promtool("test", "rules", str(RULES_TEST))
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_can_fail(tmp_path: Path) -> None:
    # The same tests with one expectation changed must fail, so the passing run above means something.
    broken = RULES_TEST.read_text().replace("severity: critical, job: g, instance: h1, uuid: GPU-a, gpu: \"0\"",
                                            "severity: warning, job: g, instance: h1, uuid: GPU-a, gpu: \"0\"", 1)
    assert broken != RULES_TEST.read_text()
    (tmp_path / "t.yml").write_text(broken.replace("../../dashboards/gpuwatchd.rules.yml", str(RULES)))
    r = promtool("test", "rules", str(tmp_path / "t.yml"))
    assert r.returncode != 0


def test_contract_alert_names_and_labels() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= CONTRACT_ALERTS
    assert "GpuMemoryLeak" not in {a["alert"] for a in alerts}  # the daemon's verdict only (deploy/prometheus/)
    for a in alerts:
        assert a["labels"]["severity"] in {"info", "warning", "critical"}, a["alert"]
        assert {"summary", "description"} <= set(a["annotations"]), a["alert"]


def rule_engine_names() -> set[str]:
    """Names the rules engine's own collector exports (not in the store's golden file)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwatchd.rules.config import RulesConfig
    from gpuwatchd.rules.engine import RulesEngine
    from gpuwatchd.rules.metrics import AlertsCollector

    reg = CollectorRegistry()
    reg.register(AlertsCollector(RulesEngine(RulesConfig(), host="h")))
    text = generate_latest(reg).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def state_db_names(tmp_path: Path) -> set[str]:
    """Names the state database's collector exports (notify/store/metrics.py)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwatchd.notify.store import StateStore

    state = StateStore(tmp_path)
    try:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(state.collector())
        text = generate_latest(reg).decode()
    finally:
        state.close()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_rules_reference_only_exported_metrics(tmp_path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    exported = golden_names() | rule_engine_names() | state_db_names(tmp_path)
    for g in doc["groups"]:
        for rule in g["rules"]:
            for name in re.findall(r"\bgpuwatchd[a-z_:]*", rule["expr"]):
                assert name in exported or name in recorded, f"{rule.get('alert') or rule.get('record')}: {name}"
