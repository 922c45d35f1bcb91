"""Memory of the NVML worker alone: spawned as the supervisor spawns it, and its imports step by step.

    python bench/worker_memory.py [--tree OTHER_CHECKOUT] [--gpus 8] [--procs 32] [--pids live] [--polls 6] [--runs 3]

1. The production worker (``python -S -m gpuwatchd.sources.nvml.worker.main``, with the argv and environment of
   ``worker_process.worker_argv`` / ``child_env``) over the stand-in driver at ``--gpus`` x ``--procs``, 1 s
   polling: RSS, USS and PSS (psutil ``memory_full_info``) after ``--polls`` lines, median of ``--runs`` workers.
   The GPU processes are real ones by default (``--pids live``: one ``sleep`` each, bench/footprint.py's
   ``live_pids``), so the worker reads them through psutil as on a user's host; ``--pids dead``: fictitious pids.
2. Its imports step by step, each step a fresh ``python -S`` with the worker's import path (median RSS of
   ``--runs``): the bare interpreter; + the standard library the worker itself uses (runpy for ``-m``, ctypes, json,
   re, threading, signal, mmap ...) and the worker package (which puts the stand-ins of
   ``worker/stand_ins.py`` in place, in trees that have them); + pynvml; + psutil; + the worker's own modules.

The tree is byte-compiled first, as an install is (bench/footprint.py). Last line: ``worker_rss_mb worker_uss_mb
worker_pss_mb`` and the steps ``bare_mb stdlib_mb pynvml_mb psutil_mb modules_mb`` (each the RSS after it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
MB = 1024 * 1024
STDLIB = ("runpy", "ctypes", "json", "re", "signal", "threading", "struct", "mmap", "time", "contextlib",
          "collections.abc", "gpuwatchd.sources.nvml.worker")
STEPS = (("bare", ()), ("stdlib", STDLIB), ("pynvml", ("pynvml",)), ("psutil", ("psutil",)),
         ("modules", ("gpuwatchd.sources.nvml.worker.main",)))


def worker_env(tree: Path, libdir: Path) -> dict[str, str]:
    """The environment the daemon in ``tree`` gives its worker (its own ``child_env``), in a child interpreter so
    that this checkout's modules do not stand in for the tree's."""
    code = ("import json, os, sys; from pathlib import Path; "
            "from gpuwatchd.sources.nvml.worker_process import child_env; "
            "print(json.dumps(child_env(dict(os.environ), Path(sys.argv[1]))))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, "-c", code, str(libdir)], env=env, cwd=tree, capture_output=True,
                         text=True, check=True).stdout
    result: dict[str, str] = json.loads(out)
    return result


def spawned(tree: Path, env: dict[str, str], libdir: Path, polls: int) -> tuple[float, float, float]:
    """RSS, USS, PSS in MB of one worker after ``polls`` lines."""
    opts = {"interval": 1.0, "library_path": str(libdir / "libnvidia-ml.so.1")}
    argv = [sys.executable, "-S", "-m", "gpuwatchd.sources.nvml.worker.main", json.dumps(opts)]
    proc = subprocess.Popen(argv, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        for n, _ in enumerate(proc.stdout, 1):
            if n > polls:  # the hello line, then one line per poll
                break
        m = psutil.Process(proc.pid).memory_full_info()
        return m.rss / MB, m.uss / MB, m.pss / MB
    finally:
        proc.kill()
        proc.wait()


def imported_rss(tree: Path, env: dict[str, str], modules: tuple[str, ...]) -> float:
    code = (f"import {', '.join(modules)}\n" if modules else "") + (
        "for line in open('/proc/self/status'):\n    line.startswith('VmRSS:') and print(line.split()[1])")
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tree, capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[-1]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the gpuwatchd checkout whose worker runs")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32, help="processes per GPU")
    ap.add_argument("--polls", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
    from footprint import add_pids_option, compile_tree, fleet

    add_pids_option(ap)
    args = ap.parse_args()
    tree = args.tree.resolve()

    from gpuwatchd.sim.build import build_standin
    from gpuwatchd.sim.standin_abi import STATE_ENV
    from gpuwatchd.sim.state import write_state

    compile_tree(tree)
    libdir = build_standin()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-worker-mem-"))
        state_path = Path(tmp) / "sim-state"
        write_state(state_path, stack.enter_context(fleet(args.gpus, args.procs, args.pids)))
        env = {**worker_env(tree, libdir), STATE_ENV: str(state_path)}
        runs = [spawned(tree, env, libdir, args.polls) for _ in range(args.runs)]
        rss, uss, pss = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"worker spawned as the supervisor does, {args.gpus}x{args.procs} (pids {args.pids}), "
              f"after {args.polls} polls (median of {args.runs}): RSS {rss:.2f} MB, USS {uss:.2f} MB, PSS {pss:.2f} MB")
        figures = {"worker_rss_mb": rss, "worker_uss_mb": uss, "worker_pss_mb": pss}
        modules: tuple[str, ...] = ()
        prev = 0.0
        for name, more in STEPS:
            modules = (*modules, *more)
            step = statistics.median(imported_rss(tree, env, modules) for _ in range(args.runs))
            print(f"  + {name:8s} {step:6.2f} MB ({step - prev:+.2f})" if prev else f"  {name:10s} {step:6.2f} MB")
            figures[f"{name}_mb"], prev = step, step
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
