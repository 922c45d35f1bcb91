"""Outside traces through `gpuwatchd sim --speed 10`, with a daemon restart in the middle of the jobs: three
memory traces as ``series`` steps reading files (one value per 5 s) on one 80 GiB GPU:
- a leak hidden under periodic evaluation spikes (384 MiB/min from 420 s, +3 GiB spikes that return),
- a saturating dynamic-shapes job (the pool grows ever more slowly towards 10 GiB, in 20 MiB segments),
- a job whose evaluation passes free their memory again (``empty_cache``).
The jobs start 120 s in; the daemon is stopped 600 s later (the leak three minutes old, the dynamic job
mid-growth) and started again with ``--resume`` on the same state dir. The leak must fire for its pid within the
issue's limits (>= 60 % of its time to full left, within 8 minutes: judged from its onset, not re-learned after
the restart); nothing else may fire, of any kind, through the jobs' first 1500 s. All waits are on conditions
with generous wall-clock bounds; the scenario itself is the clock."""

from __future__ import annotations

import math
import random
from datetime import datetime
from pathlib import Path

import pytest
from support import DaemonProcess, wait_until
from test_sim_cli import interrupt, sim, start_sim
from test_sim_restart_mid_job import leak_alerts, run_to_restart, status

__all__ = ["sim"]  # the fixture, used by name

MIB = 1024**2
GIB = 1024**3
STEP = 5
# The jobs start at JOB (scenario seconds): the daemon is watching the GPU by then (start_sim waits until it
# serves), so it sees them start, as a daemon running on the host would.
JOB = 120.0
END = JOB + 1500  # scenario seconds watched (the dynamic job is saturated ~1200 s after it started)
RESTART_AT = JOB + 600
LEAK_START = JOB + 420
LEAK_RATE = 384 * MIB / 60
CAPACITY = 80 * GIB


def warm(s: float, level: float) -> float:
    return level * (1 - math.exp(-3 * s / 120))


def leak(s: float, r: random.Random) -> float:
    spike = 3 * GIB if s % 300 > 260 else 0.0
    return warm(s, 6 * GIB) + LEAK_RATE * max(0.0, s - (LEAK_START - JOB)) + spike + r.gauss(0, 20 * MIB)


def dynamic(s: float, r: random.Random) -> float:
    grown = 6 * GIB * (1 - math.exp(-s / 300))
    return warm(s, 4 * GIB) + (grown // (20 * MIB)) * 20 * MIB + r.gauss(0, 5 * MIB)


def evaluation(s: float, r: random.Random) -> float:
    return warm(s, 12 * GIB) + (4 * GIB if s % 400 > 340 else 0.0) + r.gauss(0, 30 * MIB)


TRACES = {5001: ("train_leak", leak), 5002: ("train_dyn", dynamic), 5003: ("train_eval", evaluation)}


def scenario(tmp: Path) -> str:
    steps = []
    for pid, (name, f) in TRACES.items():
        r = random.Random(pid)
        trace = tmp / f"{name}.txt"
        trace.write_text("".join(f"{max(0, int(f(s, r)))}\n" for s in range(0, int(3 * END), STEP)))
        path = f"devices[0].processes.compute[pid={pid}].used_memory"
        steps.append(f"  - at: {JOB:.0f}\n    add_process: {{gpu: 0, pid: {pid}, name: {name}, used_memory: 0}}\n"
                     f"  - at: {JOB:.0f}\n    series: {{path: \"{path}\", every: {STEP}, file: \"{trace}\"}}\n")
    return ("name: restart-outside-traces\n"
            "description: a leak under evaluation spikes, a saturating job and an evaluating job; one 80 GiB GPU.\n"
            "gpus: 1\n"
            "devices:\n  all: {name: NVIDIA A100-SXM4-80GB, memory: {total: 80GiB}}\n"
            "timeline:\n" + "".join(steps))


@pytest.mark.timeout(900)
def test_outside_traces_across_a_restart_leak_fires_in_time_and_nothing_else(
    sim: list[DaemonProcess], tmp_path: Path
) -> None:
    first, args = run_to_restart(sim, tmp_path, scenario(tmp_path), RESTART_AT)
    early = leak_alerts(first)
    assert interrupt(first) == 0
    assert not [a for a in early if a["labels"].get("pid") != "5001"], early

    (tmp_path / "run2").mkdir()
    second = start_sim(sim, tmp_path / "run2", *args, "--resume")
    start = status(second)["scenario"]["start"]
    seen: list[dict] = []  # type: ignore[type-arg]

    def done() -> bool:
        seen.extend(leak_alerts(second))
        return bool(status(second)["scenario"]["time"] >= END)

    wait_until(done, f"the scenario to reach {END} s", timeout=END / 10 + 300)
    wrong = {(a["labels"].get("pid"), a["labels"].get("kind"), a["state"]) for a in seen
             if a["labels"].get("pid") != "5001" or a["labels"].get("kind") != "gpu"}
    assert not wrong, f"false leak alerts: {sorted(map(str, wrong))}"
    firing = [a for a in seen if a["state"] == "firing"]
    assert firing, "the leak never fired"
    fired_at = min(datetime.fromisoformat(a["firedAt"].replace("Z", "+00:00")).timestamp() for a in firing) - start
    # Full when the leak has taken what the others (10 + 12 GiB, plus 4 GiB of evaluation and 3 GiB of its own
    # spikes at worst) leave: well over an hour after it began.
    full_at = LEAK_START + (CAPACITY - 6 * GIB - 10 * GIB - 16 * GIB - 3 * GIB) / LEAK_RATE
    left = 1 - (fired_at - LEAK_START) / (full_at - LEAK_START)
    print(f"leak fired {fired_at - LEAK_START:.0f}s after it began, {left:.0%} of its time to full left")
    # The issue's limits: >= 60 % of its time to full left, and (a leak >= 1 h from full) within 8 minutes; fed
    # the same traces offline (bench/detect.py's way, any evaluation phase) it fires 346-360 s after it began.
    assert fired_at > LEAK_START and left >= 0.6
    assert fired_at - LEAK_START <= 480
    assert interrupt(second) == 0
