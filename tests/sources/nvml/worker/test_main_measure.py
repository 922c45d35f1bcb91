"""The worker's bench hook (``measure_after``) and its resilience to a garbage sim state file."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.sim.state import make_state
from tests.sources.workerutil import LiveWorker, run_worker

StateWriter = Callable[[dict[str, Any]], Path]
MEASURED = re.compile(r"nvml_worker\[\d+\] DEBUG: measured cpu_seconds=([0-9.]+) polls=(\d+)$", re.M)


def _with_processes(gpus: int, names: list[str]) -> dict[str, Any]:
    state = make_state(gpus)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {"compute": [{"pid": 5000 + 100 * g + i, "used_memory": (i + 1) << 20, "name": n,
                                         "user": "bob", "host_rss": 1 << 20} for i, n in enumerate(names)],
                            "graphics": []}
    return state


def test_measure_after_reports_cpu_of_the_measured_polls(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    path = write_sim_state(_with_processes(2, ["a", "b"]))
    code, lines, err = run_worker(standin_libdir, path, max_polls=5, measure_after=2)
    assert code == 0, err
    assert len(lines) == 5 and all(line["nvml_ok"] for line in lines)  # measuring changes nothing on stdout
    (m,) = MEASURED.findall(err)
    assert int(m[1]) == 3
    assert 0.0 < float(m[0]) < 60.0  # a real CPU time was taken (60 s: only rules out garbage like a timestamp)
    code, lines, err = run_worker(standin_libdir, path, max_polls=2)
    assert code == 0 and len(lines) == 2
    assert not MEASURED.search(err)  # off unless asked


def test_garbage_sim_state_keeps_names_and_the_worker(standin_libdir: Path, write_sim_state: StateWriter) -> None:
    path = write_sim_state(_with_processes(1, ["train", "eval"]))
    w = LiveWorker(standin_libdir, path, interval=0.02)
    try:
        first = w.next()
        assert [p["name"] for p in first["gpus"][0]["processes"]] == ["eval", "train"]
        path.write_text("GWSIM 1\n# json {not json\n")  # torn / hand-edited: the stand-in keeps its last state
        assert w.proc.stderr is not None
        warning = w.proc.stderr.readline()
        assert "WARNING" in warning and "keeping the last good process names" in warning, warning
        after = time.time()
        line = w.next()
        while line["timestamp"] <= after:  # skip lines polled before the resolver saw the garbage
            line = w.next()
        for _ in range(3):  # several polls on the same bad file
            line = w.next()
        assert [p["name"] for p in line["gpus"][0]["processes"]] == ["eval", "train"]
        assert w.proc.poll() is None
        w.proc.kill()
        w.proc.wait()
        rest = w.proc.stderr.read()
    finally:
        w.close()
    assert "WARNING" not in rest and "Traceback" not in rest  # logged once, no crash
