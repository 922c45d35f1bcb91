"""Event-loop cost per poll of taking a worker line into the Store, on the path the daemon takes.

    python bench/loop.py [--quick] [--profile]

A real worker line is produced once per size by the NVML worker against the stand-in (8 GPUs x 32 processes and
16 x 256, top_n = all processes, so every process crosses the pipe). Then, in this process, the production code:
decode = ``json.loads`` + ``SnapshotIntake.receive`` (the supervisor's intake: stamping, ``snapshot_from_dict``);
encode = ``worker_protocol.encode_line`` of the worker's dict (the worker's side of the pipe); apply =
``Store.apply`` of consecutive snapshots 1 s apart (default 5 s step, 1 h retention), timed after a warm-up so
every ring runs in its steady state; evaluate = ``RulesEngine.evaluate`` after each of those polls (the daemon
evaluates once per poll), as a mean: families with a longer interval (leak) run on some polls only, and the mean is
what they cost per poll. Each figure is the median of REPEATS timings, in ms per poll.
``--profile`` prints a cProfile of decode + apply to stderr. The last line holds the figures as name=value pairs.
"""

from __future__ import annotations

import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.model import Snapshot  # noqa: E402
from gpuwatchd.rules.config import RulesConfig  # noqa: E402
from gpuwatchd.rules.engine import RulesEngine  # noqa: E402
from gpuwatchd.runtime.clock import ManualClock  # noqa: E402
from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.standin_abi import STATE_ENV  # noqa: E402
from gpuwatchd.sim.state import make_state, write_state  # noqa: E402
from gpuwatchd.sim.worker import WORKER_MODULE  # noqa: E402
from gpuwatchd.sources.nvml.intake import SnapshotIntake  # noqa: E402
from gpuwatchd.sources.nvml.protocol import encode_line  # noqa: E402
from gpuwatchd.store import Store  # noqa: E402

SIZES = [(8, 32), (16, 256)]  # GPUs, processes per GPU
REPEATS = 5


# -- measurement -------------------------------------------------------------------------------------------------


def bench_state(gpus: int, procs: int) -> dict[str, Any]:
    state = make_state(gpus)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {
            "compute": [{"pid": 10_000 + g * 1000 + i, "used_memory": (i + 1) << 20, "name": f"train{i}",
                         "user": "alice", "host_rss": 1 << 30} for i in range(procs)],
            "graphics": [],
        }
    return state


def worker_line(libdir: Path, gpus: int, procs: int) -> str:
    """One snapshot line as the real worker writes it to the daemon, against the stand-in."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        write_state(state, bench_state(gpus, procs))
        env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), STATE_ENV: str(state)}
        opts = {"interval": 0.0, "max_polls": 1, "top_n": procs}
        r = subprocess.run([sys.executable, "-m", WORKER_MODULE, json.dumps(opts)], env=env,
                           capture_output=True, text=True, timeout=120, check=True)
    line = r.stdout.splitlines()[1]  # after the hello line
    snap = intake().receive(json.loads(line))
    assert len(snap.gpus) == gpus and all(len(g.processes) == procs for g in snap.gpus), r.stderr
    return line


def per_poll_ms(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def intake() -> SnapshotIntake:
    """The daemon's snapshot intake, as the supervisor holds it."""
    return SnapshotIntake(ManualClock())


def snapshots(line: str, n: int, t0: float) -> list[Snapshot]:
    base = intake().receive(json.loads(line))
    return [dataclasses.replace(base, timestamp=t0 + i) for i in range(n)]


def apply_ms(snaps: list[Snapshot], warm: int) -> float:
    """Apply ``warm`` polls (rings reach retention), then time the rest, REPEATS times on fresh stores."""
    times = []
    for _ in range(REPEATS):
        store = Store()
        for s in snaps[:warm]:
            store.apply(s)
        t0 = time.perf_counter()
        for s in snaps[warm:]:
            store.apply(s)
        times.append((time.perf_counter() - t0) / (len(snaps) - warm) * 1e3)
    return statistics.median(times)


def evaluate_ms(snaps: list[Snapshot], warm: int) -> float:
    """Mean ms of a rules evaluation per poll, after ``warm`` polls (median of REPEATS runs on fresh stores)."""
    times = []
    for _ in range(REPEATS):
        store, engine = Store(), RulesEngine(RulesConfig(), host="bench")
        for s in snaps[:warm]:
            store.apply(s)
            engine.evaluate(store, s.timestamp)
        spent = 0.0
        for s in snaps[warm:]:
            store.apply(s)
            t0 = time.perf_counter()
            engine.evaluate(store, s.timestamp)
            spent += time.perf_counter() - t0
        times.append(spent / (len(snaps) - warm) * 1e3)
    return statistics.median(times)


def main() -> None:
    quick = "--quick" in sys.argv
    libdir = build_standin()
    figures: dict[str, float] = {}
    for gpus, procs in SIZES:
        line = worker_line(libdir, gpus, procs)
        sup = intake()
        raw = json.loads(line)
        n = 20 if quick else 100
        tag = f"{gpus}x{procs}"
        figures[f"decode_ms_{tag}"] = per_poll_ms(lambda line=line, sup=sup: sup.receive(json.loads(line)), n)  # type: ignore[misc]
        figures[f"encode_ms_{tag}"] = per_poll_ms(lambda raw=raw: encode_line(raw), n)  # type: ignore[misc]
        warm = 30  # past a few steps: every ring is in its steady state (replace the newest / append + expire)
        snaps = snapshots(line, warm + (20 if quick else 100), 1_700_000_000.0)
        figures[f"apply_ms_{tag}"] = apply_ms(snaps, warm)
        figures[f"evaluate_ms_{tag}"] = evaluate_ms(snaps, warm)
        if "--profile" in sys.argv:
            prof = cProfile.Profile()
            prof.enable()
            store = Store()
            for s in snaps:
                sup.receive(json.loads(line))
                store.apply(s)
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
        print(f"{tag}: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items() if k.endswith(tag)), flush=True)
    print(" ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
