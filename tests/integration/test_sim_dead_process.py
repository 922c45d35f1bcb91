"""`gpuwatchd sim --scenario dead-process-memory` end to end: the real daemon, its NVML worker on the real pynvml and
the stand-in's process lists, the sim's /proc (a pid with no entry, a zombie), the rules, read over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import DaemonProcess, wait_until
from test_sim_cli import interrupt, sim, start_sim

from gpuwatchd.sim.scenario import SCENARIO_DIR

__all__ = ["sim"]  # the fixture, used by name

NAME = "GpuMemoryHeldByDeadProcess"
SPEED = "30"  # the scenario's 16 min in ~35 wall seconds; the holds (2 min, 10 min) are scenario time


def _alerts(d: DaemonProcess) -> list[dict[str, Any]]:
    status, body = d.get("/api/v1/alerts")
    assert status == 200, body
    return [a for a in json.loads(body) if a["labels"]["alertname"] == NAME]


def _status(d: DaemonProcess) -> dict[str, Any]:
    status, body = d.get("/api/v1/status")
    assert status == 200, body
    return dict(json.loads(body))


def _host_states(d: DaemonProcess, gpu: int) -> dict[int, str | None]:
    st = _status(d)
    g = next(g for g in st["gpus"] if g["index"] == gpu)
    return {p["pid"]: p["host_state"] for p in g["processes"]}


def test_dead_pids_and_orphaned_memory_fire_then_resolve(sim: list[DaemonProcess], tmp_path: Path) -> None:
    d = start_sim(sim, tmp_path, "--scenario", "dead-process-memory", "--speed", SPEED)
    seen: dict[tuple[str, str], dict[str, Any]] = {}  # (gpu, pid) -> the alert as last read, by state

    def record() -> None:
        for a in _alerts(d):
            key = (a["labels"]["gpu"], a["labels"].get("pid", ""))
            seen.setdefault(key, {})[a["state"]] = a

    def three_fired() -> bool:
        record()
        return all("firing" in seen.get(k, {}) for k in (("0", "4242"), ("1", "5151"), ("2", "")))

    wait_until(three_fired, "the three dead-memory alerts to fire", timeout=120)
    assert _host_states(d, 0) == {4242: "gone"}  # /api/v1/status shows what /proc says of each pid
    gone = seen[("0", "4242")]["firing"]
    assert gone["labels"]["severity"] == "warning"
    summary = gone["annotations"]["summary"]
    assert "18.0 GiB held by pid 4242 (python), which no longer exists since" in summary
    assert "fuser -v /dev/nvidia*" in summary
    assert "nvidia-smi --gpu-reset" in gone["annotations"]["action"]
    assert "a zombie (exited, not reaped by its parent)" in seen[("1", "5151")]["firing"]["annotations"]["summary"]
    orphaned = seen[("2", "")]["firing"]
    assert "9.0 GiB used with no process listed since" in orphaned["annotations"]["summary"]
    # a 2 min hold from the death (t=120 s, t=180 s), a 10 min one for the orphaned memory (t=60 s)
    def fired_after(a: dict[str, Any]) -> float:
        return float(_iso(a["firedAt"]) - _iso(a["activeAt"]))
    assert 110 <= fired_after(gone) <= 200
    assert 590 <= fired_after(orphaned) <= 700

    def all_resolved() -> bool:
        record()
        return all("resolved" in seen.get(k, {}) for k in (("0", "4242"), ("1", "5151"), ("2", "")))

    wait_until(all_resolved, "the GPU reset, the reaped zombie and the released memory to resolve them", timeout=120)
    assert "pid 4242: " in seen[("0", "4242")]["resolved"]["annotations"]["summary"]
    assert "memory released" in seen[("2", "")]["resolved"]["annotations"]["summary"]
    # carol's job exited cleanly and freed its memory: never even pending
    assert ("1", "6161") not in seen
    assert "Traceback" not in d.log()
    assert interrupt(d) == 0


def test_a_daemon_that_cannot_see_the_host_pids_calls_nothing_dead(sim: list[DaemonProcess], tmp_path: Path) -> None:
    # The same host, the daemon in a container without hostPID: pid 4242 has no /proc entry *here*, which proves
    # nothing (it is "hidden"), and an empty process list proves nothing either. The zombie is still seen.
    text = (SCENARIO_DIR / "dead-process-memory.yml").read_text()
    scenario = tmp_path / "dead-process-container.yml"
    scenario.write_text(text + "  - at: 0\n    set: {host_pid_namespace: false}\n")
    d = start_sim(sim, tmp_path, "--scenario", str(scenario), "--speed", SPEED)
    seen: set[tuple[str, str, str]] = set()

    def past_the_holds() -> bool:
        seen.update((a["labels"]["gpu"], a["labels"].get("pid", ""), a["state"]) for a in _alerts(d))
        return float(_status(d)["scenario"]["time"] or 0) >= 700

    wait_until(past_the_holds, "the scenario to pass the 10 min hold of the orphaned memory", timeout=120)
    assert _host_states(d, 0) == {4242: "hidden"}
    # only the zombie on GPU 1 (a zombie is visible in the daemon's own namespace)
    assert {(g, p) for g, p, _ in seen} == {("1", "5151")}
    assert interrupt(d) == 0


def _iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
