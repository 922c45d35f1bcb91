"""docs/metrics.md documents every family the store collector can export, with its type and labels."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwatchd.exporter.collector import store_specs
from gpuwatchd.web.auth import AUTH_SPECS
from gpuwatchd.web.body_framing import FRAMING_SPECS
from gpuwatchd.web.connections import CONNECTION_SPECS
from gpuwatchd.web.request_log import BAD_REQUESTS
from gpuwatchd.web.status_body import STATUS_SPECS

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(gpuwatchd_\w+)`(?: \*\*\(contract\)\*\*)? \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def test_every_family_is_documented_with_type_and_labels() -> None:
    rows = {m.group(1): (m.group(2), m.group(3).strip()) for m in _ROW.finditer(DOC.read_text())}
    # the store's and the HTTP server's own
    specs = [*store_specs(), *CONNECTION_SPECS, BAD_REQUESTS, *AUTH_SPECS, *FRAMING_SPECS, *STATUS_SPECS]
    assert len(specs) > 50
    for s in specs:
        assert s.name in rows, f"{s.name} missing from docs/metrics.md"
        assert rows[s.name] == (s.kind, ", ".join(s.labels) if s.labels else "—"), s.name
    assert set(rows) == {s.name for s in specs}, "docs list families the exporter does not have"


def test_default_port_is_documented() -> None:
    from gpuwatchd.config.loader import DEFAULT_PORT

    assert f":{DEFAULT_PORT}" in DOC.read_text()
