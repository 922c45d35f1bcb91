"""dashboards/gpuwatchd-dashboard.json: valid Classic JSON, the grafana/dashboard-linter rules (ported; no Go
toolchain here), PromQL that promtool parses, and only metric names the exporter exports (golden files)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import GOLDEN

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "gpuwatchd-dashboard.json"
RULES = ROOT / "dashboards" / "gpuwatchd.rules.yml"
# Grafana units for our base units (ops-conventions.md §5.1).
UNIT_FOR_SUFFIX = {
    "_bytes": "bytes", "_celsius": "celsius", "_watts": "watt", "_ratio": "percentunit", "_hertz": "hertz",
}
_METRIC = re.compile(r"\b(gpuwatchd[a-z_:]*)")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in load()["panels"] if p["type"] != "row"]


def targets() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def exported_names() -> set[str]:
    names: set[str] = set()
    for f in GOLDEN.glob("*.prom"):
        for line in f.read_text().splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_top_level_model() -> None:
    d = load()
    assert d["uid"] and len(d["uid"]) <= 40
    assert d["editable"] is False
    assert isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]


def test_template_variables() -> None:
    vs = {v["name"]: v for v in load()["templating"]["list"]}
    assert vs["datasource"]["type"] == "datasource" and vs["datasource"]["query"] == "prometheus"
    assert vs["datasource"]["label"] == "Data source"
    for name, label in (("job", "Job"), ("instance", "Instance")):
        v = vs[name]
        assert (v["label"], v["multi"], v["allValue"], v["refresh"]) == (label, True, ".+", 2), name
        assert v["datasource"]["uid"] == "${datasource}"
    assert "gpuwatchd_gpu_info" in vs["gpu"]["definition"]


def test_panels_have_title_description_datasource_unit_targets() -> None:
    for p in panels():
        assert p["title"] and p["description"], p
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]


def test_targets_filter_job_and_instance_and_aggregate_counters() -> None:
    for title, expr in targets():
        assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, title
        for m in re.finditer(r"(\w+_total)\{", expr):
            before = expr[: m.start()]
            assert re.search(r"(rate|irate|increase)\($", before), f"{title}: counter {m.group(1)} not in rate()"
        if "rate(" in expr or "increase(" in expr:
            assert "[$__rate_interval]" in expr or "[1h]" in expr, title


def test_units_match_metric_base_units() -> None:
    for p in panels():
        exprs = [t["expr"] for t in p["targets"]]
        if any(e.startswith(("rate(", "increase(")) for e in exprs):
            continue
        names = {m for e in exprs for m in _METRIC.findall(e)}
        for suffix, unit in UNIT_FOR_SUFFIX.items():
            if names and all(n.endswith(suffix) for n in names):
                assert p["fieldConfig"]["defaults"]["unit"] == unit, p["title"]


def test_every_referenced_metric_is_exported() -> None:
    exported = exported_names()
    recorded = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}
    queries = [e for _, e in targets()] + [v.get("definition", "") for v in load()["templating"]["list"]]
    referenced = {m for q in queries for m in _METRIC.findall(q)}
    assert referenced, "no metric found: the regex is broken"
    assert referenced - exported - recorded == set()


def test_promql_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    rules = []
    for i, (_, expr) in enumerate(targets()):
        concrete = expr.replace("$__rate_interval", "5m").replace("$job", ".+").replace("$instance", ".+")
        rules.append({"record": f"dashboard:expr_{i}", "expr": concrete.replace("$gpu", ".+")})
    path = tmp_path / "dash.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
