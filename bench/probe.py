"""Cost and detection power of the torch health probes.

    python bench/probe.py [--runs 3] [--healthy 20] [--seconds 60]

- ``probe_cpu_s``: wall time of one default probe run on the CPU device (the worker as the sim runs it: a fresh
  ``python -m gpuwatchd.probes.worker`` including the torch import), median of ``--runs``.
- ``duty_cycle``: probe time share of one GPU at the default schedule (``probes.interval`` 1 h): probe_cpu_s /
  interval. On a real GPU a run is ~10-20 s (torch, CUDA context, larger sizes), still <= 0.006; the
  ``probes.duty_cycle`` cap (1%) is enforced on top.
- ``daemon_cpu_pct_with_probes`` / ``..._without_probes``: CPU of the daemon process itself (its probe workers are
  children and not counted: that is the probe's own cost, above) under ``gpuwatchd sim --scenario idle`` at 10x
  speed with probes every 2 min of scenario time (one run per 12 s wall, 300x the default rate), as a percentage
  of one core over ``--seconds``; goal: the runner costs the daemon <= 0.1 percentage points.
- ``sdc_detected``: injected corruptions caught (flipped GEMM elements 1..5 and stuck memory bits in 1..5 words,
  one run each, in this process), goal N/N.
- ``false_failures``: healthy runs (in this process) judged anything but pass, goal 0.

Last line: ``probe_cpu_s=... duty_cycle=... daemon_cpu_pct_with_probes=... daemon_cpu_pct_without_probes=...
sdc_detected=N/N false_failures=...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.probes.config import ProbesConfig  # noqa: E402
from gpuwatchd.probes.faults import ProbeFaults  # noqa: E402
from gpuwatchd.probes.service import CPU_SIZES  # noqa: E402
from gpuwatchd.probes.verdict import judge_probe  # noqa: E402
from gpuwatchd.probes.worker import parse_args, run_probes  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def probe_cpu_seconds(runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpuwatchd.probes.worker", "--device", "cpu", *CPU_SIZES], env=ENV,
                       check=True, capture_output=True, timeout=300)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def detection(healthy: int) -> tuple[int, int, int]:
    import torch

    caught = injected = 0
    for faults, probe in [*((ProbeFaults(gemm_flip=k), "gemm") for k in range(1, 6)),
                          *((ProbeFaults(stuck_bits=k), "memory") for k in range(1, 6))]:
        out = run_probes(torch, parse_args(["--device", "cpu", *CPU_SIZES, "--probe", probe]), faults)
        injected += 1
        caught += judge_probe(probe, out["probes"][probe]).result == "fail"
    false = 0
    for _ in range(healthy):
        out = run_probes(torch, parse_args(["--device", "cpu", *CPU_SIZES]), ProbeFaults())
        false += any(judge_probe(p, e).result != "pass" for p, e in out["probes"].items())
    return caught, injected, false


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemon_cpu_pct(probes: bool, seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "gpuwatchd.yml"
        cfg.write_text(f"probes: {{enabled: {'true' if probes else 'false'}}}\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--gpus", "1", "--speed", "10",
             "--listen", f"127.0.0.1:{_free_port()}", "--config", str(cfg), "--state-dir", str(Path(tmp) / "sd")],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p = psutil.Process(proc.pid)
            time.sleep(10)  # start-up (imports, stand-in build check) is not the steady state
            c0, t0 = p.cpu_times(), time.monotonic()
            time.sleep(seconds)
            c1, t1 = p.cpu_times(), time.monotonic()
            return 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--healthy", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    cpu_s = probe_cpu_seconds(args.runs)
    duty = cpu_s / ProbesConfig().interval
    caught, injected, false = detection(args.healthy)
    # Interleaved halves so other load on the machine hits both alike.
    with_p, without_p = [], []
    for _ in range(2):
        without_p.append(daemon_cpu_pct(False, args.seconds / 2))
        with_p.append(daemon_cpu_pct(True, args.seconds / 2))
    print(f"probe_cpu_s={cpu_s:.2f} duty_cycle={duty:.5f} daemon_cpu_pct_with_probes={statistics.mean(with_p):.2f} "
          f"daemon_cpu_pct_without_probes={statistics.mean(without_p):.2f} sdc_detected={caught}/{injected} "
          f"false_failures={false}")


if __name__ == "__main__":
    main()
