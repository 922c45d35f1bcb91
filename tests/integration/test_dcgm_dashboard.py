"""dcgm-exporter's own Grafana dashboard against gpuwatchd with ``exporter.compat: dcgm``: a real Prometheus scrapes
``gpuwatchd sim`` under a scenario, and every query of the dashboard (fixtures/dcgm-exporter, NVIDIA's file
unchanged), with its template variables resolved and substituted as Grafana does, returns data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, DaemonProcess, free_port, wait_until
from test_prometheus import PROMETHEUS, prometheus, query  # noqa: F401  (the fixture is used by name)

DASHBOARD = Path(__file__).parent / "fixtures" / "dcgm-exporter" / "dcgm-exporter-dashboard.json"
# 8 H100s with GPM activity, so DCGM_FI_PROF_PIPE_TENSOR_ACTIVE has a source (a scenario file, as users write them)
SCENARIO = Path(__file__).parent / "fixtures" / "dcgm-exporter" / "h100-training.yml"
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Prometheus server not installed (Debian package `prometheus`; .ci/run installs it)"
)
_LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[^,]+),\s*(?P<label>\w+)\)$")


def panels_targets(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target, rows' panels included."""
    for p in panels:
        yield from panels_targets(p.get("panels", []))
        for t in p.get("targets", []):
            if t.get("expr"):
                yield p.get("title", "?"), t["expr"]


def regex_value(values: list[str]) -> str:
    """A multi-value / All selection as Grafana's Prometheus data source writes it into ``=~``: every value
    regex-escaped (a backslash doubled again inside the PromQL string), joined ``(a|b)``; one value bare."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def series_label_values(base: str, metric: str, label: str) -> list[str]:
    """Grafana's ``label_values(metric, label)``: the label's values on the series of ``metric``."""
    url = f"{base}/api/v1/series?{urllib.parse.urlencode({'match[]': metric})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.load(r)
    except OSError:
        return []
    return sorted({s[label] for s in doc.get("data", []) if label in s})


@pytest.fixture
def sim_with_compat(tmp_path: Path) -> Iterator[DaemonProcess]:
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"exporter": {"compat": "dcgm"}, "host": "gpu-node-1"}))
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", str(SCENARIO), "--speed", "4",
             "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", cfg, log_path)
    try:
        yield d
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_every_query_of_dcgm_exporters_dashboard_returns_data(
    sim_with_compat: DaemonProcess, prometheus: Callable[..., str]  # noqa: F811  (test_prometheus's fixture)
) -> None:
    d = sim_with_compat
    base = prometheus(d.url.removeprefix("http://"))
    dash = json.loads(DASHBOARD.read_text())
    variables = [v for v in dash["templating"]["list"] if v["type"] == "query"]
    assert [v["name"] for v in variables] == ["instance", "gpu"]
    targets = list(panels_targets(dash["panels"]))
    assert len(targets) == 8  # the dashboard as fetched: no query is skipped by this test

    # Template variables: Grafana runs each label_values() query; the default selection is All (no allValue set,
    # so All is every value the query found).
    options: dict[str, list[str]] = {}
    for v in variables:
        m = _LABEL_VALUES.match(v["query"])
        assert m is not None, v["query"]
        options[v["name"]] = wait_until(lambda m=m: series_label_values(base, m["metric"], m["label"]) or None,
                                        f"label_values for ${v['name']}", timeout=120)
    assert options["instance"] == [d.url.removeprefix("http://")]
    assert options["gpu"] == [str(i) for i in range(8)]

    for selection in ("all", "first"):
        chosen = {k: vals if selection == "all" else vals[:1] for k, vals in options.items()}
        for title, expr in targets:
            promql = expr
            for name, vals in chosen.items():
                promql = promql.replace(f"${name}", regex_value(vals))
            result = wait_until(lambda q=promql: query(base, q) or None, f"{title!r}: {promql}", timeout=120)
            if selection == "first":  # per-GPU panels show GPU 0 only; sum()/avg() panels have no gpu label
                assert all(r["metric"].get("gpu", "0") == "0" for r in result), (title, result)
            assert all(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result), (title, result)


def sample_lines(d: DaemonProcess, family: str, ok: Callable[[str], bool], what: str) -> list[str]:
    """The 8 sample lines of ``family`` on /metrics once each passes ``ok`` (polled)."""

    def lines() -> list[str] | None:
        try:
            status, body = d.get("/metrics")
        except OSError:
            return None
        got = [ln for ln in body.splitlines() if ln.startswith(family + "{")]
        return got if status == 200 and len(got) == 8 and all(ok(ln) for ln in got) else None

    result: list[str] = wait_until(lines, what, timeout=120)
    return result


def test_compat_series_carry_dcgm_labels(sim_with_compat: DaemonProcess) -> None:
    lines = sample_lines(sim_with_compat, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", lambda ln: True,
                         "8 GPUs' tensor activity under its DCGM name")
    for ln in lines:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', ln.split("}")[0]))
        assert set(labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                               "DCGM_FI_DRIVER_VERSION"}, ln
        assert labels["Hostname"] == "gpu-node-1" and labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["UUID"].startswith("GPU-") and "H100" in labels["modelName"]


def test_per_process_utilization_through_the_daemon(sim_with_compat: DaemonProcess) -> None:
    # the scenario's torchrun processes have sm_util 90: stand-in samples -> worker -> store -> /metrics
    lines = sample_lines(sim_with_compat, "gpuwatchd_gpu_process_sm_utilization_ratio", lambda ln: ln.endswith(" 0.9"),
                         "8 processes' SM utilization 0.9")
    assert {re.search(r'pid="(\d+)"', ln).group(1) for ln in lines} == {str(7000 + i) for i in range(8)}  # type: ignore[union-attr]


def test_default_output_has_no_dcgm_names(
    start_daemon: Callable[..., DaemonProcess], standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path]
) -> None:
    from gpuwatchd.sim.state import make_state

    d = start_daemon({"nvml": {"library_path": str(standin_libdir), "poll_interval": "200ms"}},
                     write_sim_state(make_state(2)))

    def body() -> str | None:
        status, text = d.get("/metrics")
        return text if status == 200 and "gpuwatchd_gpu_memory_used_bytes{" in text else None

    text = wait_until(body, "GPU readings on /metrics")
    assert "DCGM_" not in text  # exporter.compat unset: gpuwatchd's own names only
