"""A daemon restarted in the middle of a job, end to end: `gpuwatchd sim --speed 10 --state-dir D` stopped while
a saturating dynamic-shapes job grows and before a leak begins, then started again with `--resume`. The history
saved in D carries both jobs' starts across the restart: the leak fires before the GPU is full, the saturating
job never does. All waits are on conditions, with generous wall-clock bounds; the scenario itself is the clock."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from support import DaemonProcess, value, wait_until
from test_sim_cli import interrupt, sim, start_sim

__all__ = ["sim"]  # the fixture, used by name

GIB = 1024**3
RESTART_AT = 240.0  # scenario seconds: the dynamic job is mid-growth, the leak has not begun
LEAK_START = 300.0
LEAK_RATE = 17 * GIB / 3600  # bytes/s: 3 -> 20 GiB over an hour (~290 MiB/min)
CAPACITY = 24 * GIB

SCENARIO = f"""\
name: restart-mid-job
description: A dynamic-shapes job saturating at 10 GiB and a leak from 300 s, on one 24 GiB GPU.
gpus: 1
devices:
  all: {{name: NVIDIA RTX A5000, memory: {{total: 24GiB}}}}
timeline:
  - at: 20
    add_process: {{gpu: 0, pid: 4242, name: train_dyn, used_memory: 500MiB}}
  - at: 20
    plateau: {{path: "devices[0].processes.compute[pid=4242].used_memory", base: 500MiB, peak: 10GiB, warmup: 900}}
  - at: 60
    add_process: {{gpu: 0, pid: 4343, name: train_leak, used_memory: 3GiB}}
  - at: {LEAK_START:.0f}
    ramp: {{path: "devices[0].processes.compute[pid=4343].used_memory", from: 3GiB, to: 20GiB, over: 3600}}
"""


def status(d: DaemonProcess) -> dict:  # type: ignore[type-arg]
    code, body = d.get("/api/v1/status")
    assert code == 200
    return json.loads(body)  # type: ignore[no-any-return]


def leak_alerts(d: DaemonProcess) -> list[dict]:  # type: ignore[type-arg]
    code, body = d.get("/api/v1/alerts")
    assert code == 200
    return [a for a in json.loads(body) if a["labels"].get("alertname") == "GpuMemoryLeak"]


def run_to_restart(sim: list[DaemonProcess], tmp_path: Path, scenario: str,
                   restart_at: float) -> tuple[DaemonProcess, tuple[str, ...]]:
    """The first of two runs of ``scenario`` at --speed 10 sharing tmp_path/state, once it reached ``restart_at``
    scenario seconds (still running); and the arguments the second run takes again, with ``--resume``."""
    scen = tmp_path / "scenario.yml"
    scen.write_text(scenario)
    args = ("--scenario", str(scen), "--speed", "10", "--state-dir", str(tmp_path / "state"))
    (tmp_path / "run1").mkdir()
    first = start_sim(sim, tmp_path / "run1", *args)
    wait_until(lambda: status(first)["scenario"]["time"] >= restart_at, "the first run to reach the restart",
               timeout=300)
    return first, args


@pytest.mark.timeout(600)
def test_restart_mid_job_keeps_onsets_leak_fires_saturating_job_does_not(
    sim: list[DaemonProcess], tmp_path: Path
) -> None:
    first, args = run_to_restart(sim, tmp_path, SCENARIO, RESTART_AT)
    assert interrupt(first) == 0
    assert (tmp_path / "state" / "rule-history.z").exists()

    (tmp_path / "run2").mkdir()
    second = start_sim(sim, tmp_path / "run2", *args, "--resume")
    st = status(second)
    assert st["scenario"]["time"] >= RESTART_AT  # it went on, not over
    start = st["scenario"]["start"]
    samples = second.metrics()
    assert (value(samples, "gpuwatchd_rule_history_restored_series") or 0) >= 3  # the GPU and both processes

    def fired() -> dict | None:  # type: ignore[type-arg]
        return next((a for a in leak_alerts(second) if a["state"] == "firing"), None)

    alert = wait_until(fired, "the leak to fire", timeout=400)
    # the whole alert on failure: which process, the evidence it fired on and when (a run that cannot be repeated)
    assert alert["labels"]["pid"] == "4343" and alert["labels"]["kind"] == "gpu", json.dumps(alert)
    fired_at = datetime.fromisoformat(alert["firedAt"].replace("Z", "+00:00")).timestamp() - start
    # Full when the leak has taken what the saturated job (10 GiB) and the driver leave: about 37 min in.
    full_at = LEAK_START + (CAPACITY - 10 * GIB - 3 * GIB - 0.5 * GIB) / LEAK_RATE
    assert fired_at < full_at
    left = 1 - (fired_at - LEAK_START) / (full_at - LEAK_START)
    print(f"leak fired {fired_at - LEAK_START:.0f}s after it began, {left:.0%} of its time to full left")
    # The dynamic job saturates by ~920 s; watch it to its end: never a leak.
    wait_until(lambda: status(second)["scenario"]["time"] >= 1000, "the dynamic job to saturate", timeout=300)
    assert not [a for a in leak_alerts(second) if a["labels"].get("pid") == "4242"]
    assert interrupt(second) == 0
