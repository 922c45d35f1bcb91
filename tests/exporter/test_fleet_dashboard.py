"""dashboards/gpuwatchd-fleet.json: Grafana's dashboard model as far as it can be checked without a Grafana (the
classic JSON keys, core panel types, a grid without overlaps), the linter rules the host dashboard follows, PromQL
that promtool parses, only exported or recorded names, bounded series for hundreds of hosts, legends by host and GPU
index, and drill-down links into the host dashboard. tests/integration/test_fleet.py runs every query against real
data on Prometheus and VictoriaMetrics."""

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
from .test_dashboard import DASHBOARD as HOST_DASHBOARD

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "dashboards" / "gpuwatchd-fleet.json"
FLEET_RULES = ROOT / "deploy" / "prometheus" / "gpuwatchd-fleet.rules.yml"
# Grafana's core panel plugins this dashboard may use (public/app/plugins/panel in grafana/grafana).
CORE_PANELS = {"row", "stat", "timeseries", "table", "bargauge", "state-timeline", "gauge"}
_NAME = re.compile(r"\b((?:gpuwatchd|host|fleet)[_:][a-z_:0-9]*|up|scrape_duration_seconds)\b")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FLEET.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in load()["panels"] if p["type"] != "row"]


def fleet_targets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) of every query."""
    return [(p, t) for p in panels() for t in p["targets"]]


def concrete(expr: str) -> str:
    """A query as Grafana sends it with every variable on All and a 1m rate interval."""
    return expr.replace("$__rate_interval", "1m").replace("$job", ".+").replace("$host", ".+")


def test_grafana_model() -> None:
    d = load()
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list), ("templating", dict),
                      ("time", dict), ("tags", list), ("links", list), ("annotations", dict)):
        assert isinstance(d[key], kind), key
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]) and d["uid"] != json.loads(HOST_DASHBOARD.read_text())["uid"]
    assert d["editable"] is False and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in CORE_PANELS, p["type"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def _lost_keys(original: Any, decoded: Any, path: str = "") -> list[str]:
    """Keys of ``original`` that ``decoded`` does not have (anywhere in the tree)."""
    if isinstance(original, dict):
        if not isinstance(decoded, dict):
            return [path]
        return [k for key in original for k in (
            [f"{path}.{key}"] if key not in decoded else _lost_keys(original[key], decoded[key], f"{path}.{key}"))]
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(original) != len(decoded):
            return [path]
        pairs = enumerate(zip(original, decoded, strict=True))
        return [k for i, (a, b) in pairs for k in _lost_keys(a, b, f"{path}[{i}]")]
    return [] if original == decoded else [f"{path} (value changed)"]


def test_decodes_in_grafanas_dashboard_model_without_losing_a_key() -> None:
    """Grafana's own dashboard types (grafana-foundation-sdk, generated from its schema) read every key back: a
    misspelled or misplaced key would be dropped. Only a query variable's ``definition`` (written by Grafana's own
    variable editor, not in the schema) is outside the model."""
    sdk = pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk (the test extra) not installed")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    assert sdk is not None
    original = load()
    decoded = json.loads(JSONEncoder().encode(Dashboard.from_json(original)))
    lost = _lost_keys(original, decoded)
    assert lost == [f".templating.list[{i}].definition" for i in (1, 2)]


def test_template_variables() -> None:
    vs = {v["name"]: v for v in load()["templating"]["list"]}
    assert list(vs) == ["datasource", "job", "host"]
    assert vs["datasource"]["query"] == "prometheus"
    for name in ("job", "host"):
        v = vs[name]
        assert (v["multi"], v["includeAll"], v["allValue"], v["refresh"]) == (True, True, ".+", 2), name
        assert v["datasource"]["uid"] == "${datasource}"
    assert vs["host"]["definition"] == 'label_values(gpuwatchd_build_info{job=~"$job"}, host)'


def test_panels_have_title_description_datasource_unit() -> None:
    for p in panels():
        assert p["title"] and p["description"], p
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and p["fieldConfig"]["defaults"].get("unit"), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"], p["title"]


def test_every_query_follows_the_host_variable_and_rates_its_counters() -> None:
    for p, t in fleet_targets():
        expr = t["expr"]
        assert 'host=~"$host"' in expr, p["title"]
        for m in re.finditer(r"(\w+_total)\{", expr):
            assert re.search(r"(rate|irate|increase)\($", expr[: m.start()]), f"{p['title']}: {m.group(1)} not rated"


def test_series_stay_bounded_for_hundreds_of_hosts() -> None:
    """A graph line per host (or per host and GPU) is capped by topk/bottomk; other graphs aggregate hosts away."""
    for p, t in fleet_targets():
        if p["type"] in ("timeseries", "bargauge") and "{{host}}" in t["legendFormat"]:
            assert t["expr"].startswith(("topk(", "bottomk(")), p["title"]
        if p["type"] == "table" and "host" in t["expr"] and not t["expr"].startswith("up{"):
            assert t.get("instant") is True, p["title"]  # one row per host/GPU now, not a range per series


def test_legends_name_host_and_gpu_index_never_a_uuid() -> None:
    for p, t in fleet_targets():
        assert "uuid" not in t["legendFormat"], p["title"]
        # A per-GPU line says which host and which GPU index.
        if "index" in t["legendFormat"] or "gpu" in t["legendFormat"].lower().replace("gpus", ""):
            assert "{{host}}" in t["legendFormat"], p["title"]
        # The outermost aggregation never keeps uuid (tests/integration/test_fleet.py checks every result too).
        outer = re.match(r"^(?:(?:topk|bottomk)\(\d+, )?\w+ by \(([^)]*)\)", t["expr"])
        if outer is not None:
            assert "uuid" not in {x.strip() for x in outer.group(1).split(",")}, p["title"]


def test_drill_down_links_open_the_host_dashboard_for_that_host() -> None:
    host = json.loads(HOST_DASHBOARD.read_text())
    host_vars = {v["name"] for v in host["templating"]["list"]}
    assert {"job", "instance"} <= host_vars
    linked = 0
    for p in panels():
        for link in p["fieldConfig"]["defaults"].get("links", []):
            assert link["url"].startswith(f"/d/{host['uid']}/"), p["title"]
            assert "var-instance=${__" in link["url"] and "var-job=${__" in link["url"], p["title"]
            assert "${__url_time_range}" in link["url"], p["title"]
            linked += 1
            # the link's fields exist in the panel's results: tables keep job and instance in their by ()
            if p["type"] == "table":
                for t in p["targets"]:
                    assert t["expr"].startswith("up{") or ("instance" in t["expr"] and "job" in t["expr"]), p["title"]
    assert linked >= 6
    assert any(lk["url"].startswith(f"/d/{host['uid']}/") for lk in load()["links"])


def test_every_referenced_name_is_exported_or_recorded() -> None:
    exported = {line.split()[2] for f in GOLDEN.glob("*.prom") for line in f.read_text().splitlines()
                if line.startswith("# TYPE ")}
    exported |= {"gpuwatchd_alerts", "up", "scrape_duration_seconds"}  # rules engine's family; Prometheus' own
    from gpuwatchd.exporter.health_families import HEALTH_STATE

    exported.add(HEALTH_STATE.name)  # no health assessed in the golden stores: declared, not in their text
    recorded = {r["record"] for g in yaml.safe_load(FLEET_RULES.read_text())["groups"] for r in g["rules"]
                if "record" in r}
    queries = [t["expr"] for _, t in fleet_targets()] + [v.get("definition", "") for v in load()["templating"]["list"]]
    referenced = {m for q in queries for m in _NAME.findall(q)}
    assert len(referenced) > 10, "the name regex is broken"
    assert referenced - exported - recorded == set()


def test_promql_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    rules = [{"record": f"dashboard:expr_{i}", "expr": concrete(t["expr"])} for i, (_, t) in enumerate(fleet_targets())]
    path = tmp_path / "fleet-dash.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
