"""``promtool check metrics`` prints nothing for every store state the exporter can see."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
from gpuwatchd.store import Store

from .conftest import exposition, promtool_check, registry_for, store_from_fixture


def _empty() -> Store:
    return Store()


def _mixed() -> Store:
    return store_from_fixture("store_mixed.json")


def _nvml_down() -> Store:
    store = _mixed()
    store.apply(Snapshot(timestamp=1_700_000_100.0, nvml_ok=False, nvml_error="driver_not_loaded"))
    return store


def _stale() -> Store:
    store = _mixed()
    store.mark_stale()
    return store


def _all_gone() -> Store:
    store = _mixed()
    assert store.latest is not None
    store.apply(replace(store.latest, timestamp=1_700_000_200.0, gpus=(), lost=(), xid_events=(), device_count=0))
    return store


def _busy() -> Store:
    # Odd label values: quotes, backslashes and newlines in process names must be escaped, not break the format.
    procs = tuple(ProcessSample(pid=p, used_memory_bytes=p * 1024, name=f'we"ird\\name\n{p}') for p in range(1, 40))
    store = Store()
    store.apply(Snapshot(timestamp=1.0, nvml_ok=True, gpus=(GpuSample(uuid="GPU-z", index=0, processes=procs),)))
    return store


SCENARIOS: dict[str, Callable[[], Store]] = {
    "empty": _empty,
    "mixed": _mixed,
    "nvml_down": _nvml_down,
    "stale": _stale,
    "all_gone": _all_gone,
    "busy": _busy,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_promtool_check_metrics_is_silent(name: str) -> None:
    text = exposition(SCENARIOS[name]())
    result = promtool_check(text)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_promtool_catches_what_we_guard_against() -> None:
    # The check above can fail: promtool does flag a counter without _total and a family without HELP.
    result = promtool_check("# TYPE gpuwatchd_bad counter\ngpuwatchd_bad 1\n")
    assert result.returncode != 0
    assert "_total" in result.stdout + result.stderr


def test_openmetrics_exposition_is_wellformed() -> None:
    # OpenMetrics counters: TYPE line without _total, samples with it, and the mandatory # EOF at the end.
    text = generate_openmetrics(registry_for(_mixed())).decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE gpuwatchd_gpu_energy_joules counter\n" in text
    assert "# UNIT gpuwatchd_gpu_energy_joules joules\n" in text
    assert 'gpuwatchd_gpu_energy_joules_total{uuid="GPU-bbbbbbbb-0000-4000-8000-000000000000"} 1234.5\n' in text
    assert "# TYPE gpuwatchd_gpu info\n" in text
    # same sample names as the text format, apart from the OpenMetrics-only _created series
    om = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    prom = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(registry_for(_mixed())).decode().splitlines()
        if line and not line.startswith("#")
    }
    assert om == prom
