"""The /metrics name set is a public contract: a fixed store must give exactly the golden exposition.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/exporter/test_golden.py`` and review the
diff: a renamed or dropped line breaks dashboards, rules and users.
"""

from __future__ import annotations

import os
import re

import pytest
from prometheus_client import generate_latest

from gpuwatchd.exporter.collector import StoreCollector
from gpuwatchd.exporter.runtime_families import BuildInfo
from gpuwatchd.model import Snapshot

from .conftest import GOLDEN, promtool_check, registry_for, store_from_fixture

# golden file -> snapshots applied after a first scrape of fixtures/store_mixed.json (the collector is long-lived
# in the daemon, so it has seen the state before)
CASES: dict[str, tuple[Snapshot, ...]] = {
    "metrics.prom": (),
    "metrics_nvml_down.prom": (Snapshot(timestamp=1_700_000_060.0, nvml_ok=False, nvml_error="driver_not_loaded"),),
}

# Volatile values: build versions (which Python, which gpuwatchd) and timestamps are not part of the contract.
_BUILD = re.compile(r'^(gpuwatchd_build_info)\{.*\} (.*)$', re.MULTILINE)
_TIMESTAMP = re.compile(r"^(gpuwatchd_\w*timestamp_seconds(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def normalise(text: str) -> str:
    text = _BUILD.sub(r'\1{pynvml="X",python="X",version="X"} \2', text)
    return _TIMESTAMP.sub(r"\1 T", text)


@pytest.mark.parametrize("golden", sorted(CASES))
def test_exposition_matches_golden(golden: str) -> None:
    store = store_from_fixture("store_mixed.json")
    # The real build info (not a test double) so the normalisation itself is exercised.
    # The reading age is taken 3 s after the latest snapshot, whichever that is: deterministic, and not 0.
    now = lambda: (store.latest.timestamp if store.latest else 0.0) + 3.0  # noqa: E731
    reg = registry_for(store, StoreCollector(store, build=BuildInfo.detect(), now=now))
    generate_latest(reg)
    for snap in CASES[golden]:
        store.apply(snap)
    got = normalise(generate_latest(reg).decode())
    if os.environ.get("UPDATE_GOLDEN") == "1":
        (GOLDEN / golden).write_text(got)
    want = (GOLDEN / golden).read_text()
    assert got == want, "exposition changed; if intended, regenerate with UPDATE_GOLDEN=1 and review the diff"


@pytest.mark.parametrize("golden", sorted(CASES))
def test_golden_file_itself_passes_promtool(golden: str) -> None:
    # Normalised timestamps (T) are not numbers; put a number back before linting.
    text = (GOLDEN / golden).read_text().replace(" T\n", " 1700000000\n")
    result = promtool_check(text)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_normalise_only_touches_volatile_lines() -> None:
    text = (
        'gpuwatchd_build_info{pynvml="1",python="3.12.1",version="9"} 1.0\n'
        'gpuwatchd_gpu_last_seen_timestamp_seconds{uuid="u"} 1.7e+09\n'
        'gpuwatchd_gpu_power_watts{uuid="u"} 300.0\n'
    )
    assert normalise(text) == (
        'gpuwatchd_build_info{pynvml="X",python="X",version="X"} 1.0\n'
        'gpuwatchd_gpu_last_seen_timestamp_seconds{uuid="u"} T\n'
        'gpuwatchd_gpu_power_watts{uuid="u"} 300.0\n'
    )
