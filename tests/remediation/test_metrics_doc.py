"""Every family the remediation collector exports is in docs/metrics.md, "Remediation", with its labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuwatchd.remediation.counters import Counters, RemediationCollector

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_remediation_families_are_documented() -> None:
    section = DOC.read_text().split("## Remediation\n", 1)[1].split("\n## ", 1)[0]
    documented = {m.group(1): (m.group(2), m.group(3)) for m in
                  re.finditer(r"^- `(gpuwatchd_\w+)` \((\w+)(?:; ([\w, ]+))?\)", section, re.MULTILINE)}
    c = Counters()
    c.action("slurm", "drain", "ok")
    c.error("slurm", "missing")
    c.up["slurm"] = True
    c.acks["inspected"] = 1
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RemediationCollector(c, lambda: {"slurm\0n1\0false": 1}, lambda: {"GPU-x": 1}))
    families = list(reg.collect())
    assert len(families) == 7
    for f in families:
        name = f.name + ("_total" if f.type == "counter" else "")
        assert name in documented, f"{name} missing from docs/metrics.md, Remediation"
        kind, labels = documented[name]
        assert kind == f.type, name
        sample_labels = sorted({k for s in f.samples for k in s.labels})
        assert sorted((labels or "").replace(" ", "").split(",")) == sample_labels or (not labels and not
                                                                                     sample_labels), name
