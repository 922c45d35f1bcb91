"""Real memory series captured on real GPUs (``../shared/data/captures``, see its README) replayed through the
leak rule: a job start/stop (csv02) and 38 min of sustained VLM inference swinging 17.4-18.1 GB (csv04) are
not leaks."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuwatchd.model import Snapshot
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store
from tests.rules.conftest import CAPTURES, MIB, gpu, proc, snap, with_processes

CSV02 = CAPTURES / "csv02_rtx-a5000_job-start-stop_1s.csv"
CSV04 = CAPTURES / "csv04_rtx-4090_sustained-load_first2300lines.csv"


def _need(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"real capture {path.name} not available (shared captures folder {CAPTURES} absent)")


def _ts(text: str) -> float:
    return datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def read_csv02() -> list[tuple[float, int, int]]:
    """(t, used MiB, total MiB) from the custom-header nounits CSV."""
    with CSV02.open(encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    return [(_ts(r[0]), int(r[5]), int(r[4])) for r in rows]


def read_csv04() -> list[tuple[float, int, int]]:
    """(t, used MiB, 24564 MiB) from the raw CSV with units; an RTX 4090 has 24564 MiB."""
    with CSV04.open(encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    return [(_ts(r[0]), int(r[4].strip().split()[0]), 24564) for r in rows]


def replay(series: list[tuple[float, int, int]], *, stretch: float = 1.0) -> list[str]:
    """Feed the series as one process' memory (plus 300 MiB unattributed), evaluating every 30 s of replayed
    time; returns the states of every GpuMemoryLeak alert seen."""
    store = Store()
    engine = RulesEngine(RulesConfig(), host="node1")
    t0 = series[0][0]
    seen: list[str] = []
    next_eval = t0
    for t, used_mib, total_mib in series:
        tt = t0 + (t - t0) * stretch
        g = gpu(name="replay", memory_total_bytes=total_mib * MIB)
        s: Snapshot = snap(tt, with_processes(g, [proc(4242, max(0, used_mib - 300) * MIB)]))
        store.apply(s)
        if tt >= next_eval:
            seen += [a.state for a in engine.evaluate(store, tt) if a.name == "GpuMemoryLeak"]
            next_eval = tt + 30
    assert engine.evaluations > 0
    return seen


def test_csv04_sustained_inference_is_not_a_leak() -> None:
    _need(CSV04)
    series = read_csv04()
    assert series[-1][0] - series[0][0] > 30 * 60  # long enough for the rule to have an opinion
    assert replay(series) == []


def test_csv02_job_start_stop_is_not_a_leak() -> None:
    _need(CSV02)
    series = read_csv02()
    assert replay(series) == []
    # The same shape over 25 min instead of 77 s (start, warm-up step, plateau, stop): still not a leak.
    assert replay(series, stretch=20.0) == []
