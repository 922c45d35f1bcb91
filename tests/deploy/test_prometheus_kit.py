"""deploy/prometheus/: the scrape configs pass `promtool check config`, file_sd and static share one relabelling, the
fleet rules pass `promtool check rules --lint` and their own `promtool test rules` cases (which can fail), use only
names the daemon exports, and alert with the daemon's label names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.exporter.conftest import GOLDEN
from tests.exporter.test_rules_file import golden_names, rule_engine_names, state_db_names

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy" / "prometheus"
RULES = KIT / "gpuwatchd-fleet.rules.yml"
RULES_TEST = KIT / "gpuwatchd-fleet.rules_test.yml"
# The daemon's own alert names (docs/alerts.md): a fleet rule under one of them would pass for the daemon's verdict.
DAEMON_ALERTS = {
    "GpuMemoryLeak", "GpuThrottled", "GpuXidError", "GpuEccError", "GpuPcieLinkDegraded", "GpuPcieReplays", "GpuLost",
    "GpuRemoved", "GpuCountLow", "GpuTemperatureHigh", "GpuDockUnauthorized", "GpuDockLinkDegraded", "GpuProbeFailed",
    "GpuPerformanceDegraded", "GpuNvlinkErrors", "GpuRecoveryActionRequired", "GpuUnderutilized",
}


def promtool(*args: str, cwd: Path = KIT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KIT / name).read_text())
    return data


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-static.yml"])
def test_promtool_check_config(name: str) -> None:
    r = promtool("check", "config", name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr


def test_static_and_file_sd_configs_relabel_alike() -> None:
    fsd, static = load("prometheus.yml"), load("prometheus-static.yml")
    [a], [b] = fsd["scrape_configs"], static["scrape_configs"]
    assert a["file_sd_configs"] and b["static_configs"]
    for key in ("job_name", "relabel_configs", "metric_relabel_configs"):
        assert a[key] == b[key], key
    assert fsd["alerting"]["alert_relabel_configs"] == static["alerting"]["alert_relabel_configs"]
    assert fsd["rule_files"] == static["rule_files"] == ["gpuwatchd-fleet.rules.yml"]


def test_file_sd_example_is_a_target_list() -> None:
    groups = yaml.safe_load((KIT / "file_sd" / "gpuwatchd.example.yml").read_text())
    assert all(set(g) <= {"targets", "labels"} and g["targets"] for g in groups)
    assert any("host" in g.get("labels", {}) for g in groups) and any("host" not in g.get("labels", {}) for g in groups)


def host_relabel(address: str, host: str | None) -> str:
    """The relabelling of prometheus.yml applied the way Prometheus does (anchored RE2 regexes, $1 expansion);
    the fleet test shows the same on a real Prometheus."""
    labels = {"__address__": address, "host": host or ""}
    for rc in load("prometheus.yml")["scrape_configs"][0]["relabel_configs"]:
        value = rc.get("separator", ";").join(labels.get(s, "") for s in rc["source_labels"])
        m = re.fullmatch(rc.get("regex", "(.*)"), value)
        if m is not None:
            labels[rc["target_label"]] = m.expand(rc.get("replacement", "$1").replace("$1", r"\1"))
    return labels["host"]


@pytest.mark.parametrize(
    ("address", "host", "want"),
    [
        ("gpu-node-01:9945", None, "gpu-node-01"),
        ("gpu-node-01.example.org:9945", None, "gpu-node-01.example.org"),
        ("10.0.7.21:9945", "dgx-a", "dgx-a"),
        ("[fd00::5]:9945", None, "fd00::5"),
        ("gpu-node-02", None, "gpu-node-02"),
    ],
)
def test_host_label_is_stable(address: str, host: str | None, want: str) -> None:
    assert host_relabel(address, host) == want


def test_alerts_lose_job_and_instance_so_alertmanager_dedups_with_the_daemon() -> None:
    [drop] = load("prometheus.yml")["alerting"]["alert_relabel_configs"]
    assert drop["action"] == "labeldrop"
    assert re.fullmatch(drop["regex"], "job") and re.fullmatch(drop["regex"], "instance")
    assert not re.fullmatch(drop["regex"], "host")


def test_promtool_check_rules_lint() -> None:
    r = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_rules() -> None:
    r = promtool("test", "rules", RULES_TEST.name)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == {r["alert"] for r in rules() if "alert" in r}  # every fleet alert has a case
    recorded = set(re.findall(r"expr: ([\w:]+)\n", RULES_TEST.read_text()))
    assert {"gpuwatchd:gpu_memory_leak:firing", "gpuwatchd:gpu_memory_time_to_full:seconds"} <= recorded


def test_rule_unit_tests_can_fail(tmp_path: Path) -> None:
    broken = RULES_TEST.read_text().replace("exp_labels: {severity: critical, job: gpuwatchd, instance: \"gpu-a:9945\"",
                                            "exp_labels: {severity: critical, job: gpuwatchd, instance: \"gpu-b:9945\"")
    assert broken != RULES_TEST.read_text()
    (tmp_path / "t.yml").write_text(broken.replace("  - gpuwatchd-fleet.rules.yml", f"  - {RULES}"))
    r = promtool("test", "rules", str(tmp_path / "t.yml"), cwd=tmp_path)
    assert r.returncode != 0


def engine_families() -> set[str]:
    """Families the rules engine exports, with or without samples now (gpuwatchd_alerts has none while quiet)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwatchd.rules.config import RulesConfig
    from gpuwatchd.rules.engine import RulesEngine
    from gpuwatchd.rules.metrics import AlertsCollector

    reg = CollectorRegistry()
    reg.register(AlertsCollector(RulesEngine(RulesConfig(), host="h")))
    return {line.split()[2] for line in generate_latest(reg).decode().splitlines() if line.startswith("# TYPE")}


def notify_families() -> set[str]:
    """Families of alert delivery (notify/metrics.py), with one receiver's counters touched so they have samples."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwatchd.notify.metrics import GaugeState, NotifyMetrics

    m = NotifyMetrics(GaugeState)
    m.outcome("fleet#1", "alertmanager", "retry", "connection")
    m.latency.labels("fleet#1", "alertmanager").observe(0.1)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(m.collector())
    text = generate_latest(reg).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_rules_reference_only_exported_metrics(tmp_path: Path) -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    every_golden = {line.split()[2] for f in GOLDEN.glob("*.prom") for line in f.read_text().splitlines()
                    if line.startswith("# TYPE")}
    exported = golden_names() | every_golden | rule_engine_names() | engine_families() | state_db_names(tmp_path)
    exported |= notify_families()
    exported |= {"up"}
    for rule in rules():
        for name in re.findall(r"\b(gpuwatchd[_:][a-z_:0-9]*|host:[a-z_:0-9]+|up)\b", rule["expr"]):
            assert name in exported or name in recorded, f"{rule.get('alert') or rule.get('record')}: {name}"


def test_fleet_alerts_carry_the_daemons_labels_and_names_of_their_own() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert "GpuwatchdDown" in {a["alert"] for a in alerts}
    for a in alerts:
        assert a["alert"] not in DAEMON_ALERTS, a["alert"]
        assert a["labels"]["severity"] in {"info", "warning", "critical"}, a["alert"]
        assert {"summary", "description"} <= set(a["annotations"]), a["alert"]
        # Aggregations keep `host` (or, fleet-wide, name what they count by): the label Alertmanager groups on.
        for by in re.findall(r"\bby \(([^)]*)\)", a["expr"]):
            labels = {x.strip() for x in by.split(",")}
            assert "host" in labels or a["alert"] == "GpuXidFleetwide", (a["alert"], by)
