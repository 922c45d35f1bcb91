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
- ``idle_violations``: probe runs the scheduler started on a GPU that was not idle for the whole ``idle_for``
  (a compute process or utilization >= 5% in any poll of the window) over a corpus of job patterns polled every
  second for 6 h each (checkpoint write at 0% then exit, CPU-side evaluation pauses, an idle notebook, a
  hyper-parameter sweep with 90 s gaps between trials, 3 s jobs landing between history points, a job ending
  into a long idle stretch), at the default ``idle_for`` (5 min) and ticks of 5 s, goal 0. ``idle_violations_old``:
  the same corpus judged by the old rule (compute process in the latest snapshot only), for reference.
- ``idle_probe_delay_s``: worst delay, in that corpus, between a GPU becoming idle for ``idle_for`` and its due
  probe starting (goal <= the 5 s tick + one poll).
- ``crash_messages_ok``: worker deaths (SIGSEGV, SIGABRT, SIGKILL after a torch-like warning on stderr; an
  exception; a silent non-zero exit) whose alert text names the signal or exit status (and the exception) and not
  the warning line, goal N/N.
- ``hung_gpu_other_verdict_s``: two idle GPUs in one ProbeService (CPU device, default ``hang_after`` 45 s and
  ``deadline`` 120 s), the first one's worker hung: seconds until the second GPU's verdict, goal <= hang_after +
  tick + one run (it was the whole deadline, 120 s, before).

Last line: ``probe_cpu_s=... duty_cycle=... daemon_cpu_pct_with_probes=... daemon_cpu_pct_without_probes=...
sdc_detected=N/N false_failures=... idle_violations=... idle_violations_old=... idle_probe_delay_s=...
crash_messages_ok=N/N hung_gpu_other_verdict_s=...``.
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


# -- idleness -------------------------------------------------------------------------------------------------

UUID = "GPU-bench-0000-0000-0000-000000000000"


def _pattern(name: str, t: float) -> tuple[tuple[int, ...], float]:
    """(compute pids, utilization) of the GPU at second ``t`` of a 6 h pattern."""
    m = t % 3600
    if name == "checkpoint":  # train 20 min at 90%, write a checkpoint 3 min at 0% with the process, exit, 2 min gap
        cyc = t % (25 * 60)
        if cyc < 20 * 60:
            return (100 + int(t // 1500),), 0.9
        if cyc < 23 * 60:
            return (100 + int(t // 1500),), 0.0
        return (), 0.0
    if name == "cpu_eval":  # one long job that evaluates on the CPU for 4 min every 15 min (GPU at 0%)
        return (42,), (0.0 if t % 900 >= 660 else 0.8)
    if name == "notebook":  # a notebook holding a context at 0% for 2 h, then closed for the rest
        return ((7,), 0.0) if t < 7200 else ((), 0.0)
    if name == "sweep":  # 10 min trials at 80%, 90 s between them (shorter than idle_for)
        cyc = t % 690
        return (((200 + int(t // 690),), 0.8) if cyc < 600 else ((), 0.0))
    if name == "short_jobs":  # 3 s jobs every 4 min
        return (((300 + int(t // 240),), 0.0) if t % 240 < 3 else ((), 0.02))
    if name == "job_then_idle":  # a 30 min job at 0% (data loading), then idle for good
        return ((9,), 0.0) if m < 1800 and t < 3600 else ((), 0.0)
    raise ValueError(name)


PATTERNS = ("checkpoint", "cpu_eval", "notebook", "sweep", "short_jobs", "job_then_idle")


def idleness(hours: float = 6.0) -> tuple[int, int, float]:
    from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
    from gpuwatchd.probes.scheduler import Scheduler
    from gpuwatchd.store import Store

    cfg = ProbesConfig()
    violations = old_violations = 0
    worst_delay = 0.0
    for name in PATTERNS:
        store, sched = Store(), Scheduler(cfg)
        polls: list[tuple[float, tuple[int, ...], float]] = []
        idle_since: float | None = None
        for i in range(int(hours * 3600)):
            t = 1_700_000_000.0 + i
            pids, util = _pattern(name, float(i))
            polls.append((t, pids, util))
            busy = bool(pids) or util >= cfg.idle_utilization
            idle_since = None if busy else (idle_since if idle_since is not None else t)
            g = GpuSample(uuid=UUID, index=0, name="bench", utilization_gpu_ratio=util,
                          processes=tuple(ProcessSample(pid=p, used_memory_bytes=1 << 30) for p in pids))
            store.apply(Snapshot(timestamp=t, nvml_ok=True, gpus=(g,)))
            if old_rule_would_run(polls, cfg):
                old_violations += not _idle_window(polls, t, cfg)
            if i % 5:
                continue  # the service looks at the schedule every 5 s
            due, _ = sched.decide(store, t, ())
            if due:
                violations += not _idle_window(polls, t, cfg)
                if idle_since is not None and sched.gpus[UUID].last_start is None:
                    worst_delay = max(worst_delay, t - (idle_since + cfg.idle_for))
                sched.started(UUID, t)
                sched.finished(UUID, t + 15.0)
    return violations, old_violations, worst_delay


def _idle_window(polls: list[tuple[float, tuple[int, ...], float]], t: float, cfg: ProbesConfig) -> bool:
    return all(not p and u < cfg.idle_utilization for (pt, p, u) in polls[-int(cfg.idle_for) - 2:]
               if pt > t - cfg.idle_for)


def old_rule_would_run(polls: list[tuple[float, tuple[int, ...], float]], cfg: ProbesConfig) -> bool:
    """The old scheduler's test at a poll: no compute process now, utilization low in the thinned history (a point
    every 5 s): the points it kept are every 5th poll."""
    t, pids, util = polls[-1]
    if pids or util >= cfg.idle_utilization or int(t) % 3600 != 0:  # judged once an hour, like the interval
        return False
    window = [u for (pt, _, u) in polls[-int(cfg.idle_for) - 2:] if pt >= t - cfg.idle_for and int(pt) % 5 == 0]
    return all(u < cfg.idle_utilization for u in window)


# -- crash messages --------------------------------------------------------------------------------------------

TORCH_WARNING = ("torch/_subclasses/functional_tensor.py:276: UserWarning: Failed to initialize NumPy: No module "
                 "named 'numpy'\n  cpu = _conversion_method_template(device=torch.device(\"cpu\"))")
CRASHES = [
    ("import os, signal, sys; sys.stderr.write(W); sys.stderr.flush(); os.kill(os.getpid(), signal.SIGSEGV)",
     "killed by SIGSEGV"),
    ("import os, signal, sys; sys.stderr.write(W); sys.stderr.flush(); os.abort()", "killed by SIGABRT"),
    ("import os, signal, sys; sys.stderr.write(W); sys.stderr.flush(); os.kill(os.getpid(), signal.SIGKILL)",
     "killed by SIGKILL"),
    ("import sys; sys.stderr.write(W); raise RuntimeError('CUDA error: an illegal memory access')",
     "exited with status 1 after"),
    ("import sys; sys.stderr.write(W); sys.exit(2)", "exited with status 2 after"),
]


def crash_messages() -> tuple[int, int]:
    import asyncio

    from gpuwatchd.probes.runner import run_worker, worker_env

    ok = 0
    for code, want in CRASHES:
        argv = [sys.executable, "-c", f"W = {TORCH_WARNING!r} + chr(10)\n{code}"]
        run = asyncio.run(run_worker(argv, worker_env(ENV, None), 60))
        good = run.outcome == "crash" and want in run.detail and "_conversion_method" not in run.detail
        if "RuntimeError" in code:
            good = good and run.detail.endswith("RuntimeError: CUDA error: an illegal memory access")
        ok += good
    return ok, len(CRASHES)


# -- one hung GPU ----------------------------------------------------------------------------------------------

def hung_gpu_other_verdict() -> float:
    import asyncio

    from gpuwatchd.config.loader import config_from_dict
    from gpuwatchd.model import GpuSample, Snapshot
    from gpuwatchd.probes.service import ProbeService
    from gpuwatchd.runtime.clock import RealClock
    from gpuwatchd.sim.probes import SimProbes
    from gpuwatchd.sim.state import make_state, write_state
    from gpuwatchd.store import Store

    async def run(tmp: Path) -> float:
        state = make_state(2)
        hung, other = sorted(d["uuid"] for d in state["devices"])
        next(d for d in state["devices"] if d["uuid"] == hung)["_probe"] = {"hang": True}
        write_state(tmp / "state", state)
        cfg = config_from_dict({"state_dir": str(tmp), "sysfs": {"root": str(tmp / "sysfs")},
                                "probes": {"idle_for": "0s", "duty_cycle": 1.0}})
        store = Store()

        def snap() -> None:
            gpus = tuple(GpuSample(uuid=u, index=i, name="bench", utilization_gpu_ratio=0.0)
                         for i, u in enumerate((hung, other)))
            store.apply(Snapshot(timestamp=time.time(), nvml_ok=True, gpus=gpus))

        snap()
        svc = ProbeService(cfg, store, RealClock(), tmp, sim=SimProbes(tmp / "state"))
        task = asyncio.ensure_future(svc.run())
        try:
            t0 = None
            while (other, "gemm") not in store.probes.last:
                snap()
                if t0 is None and hung in svc.running:
                    t0 = time.monotonic()
                await asyncio.sleep(0.5)
            assert t0 is not None and not any(u == hung for (u, _) in store.probes.last)
            return time.monotonic() - t0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(Path(tmp)))


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
    violations, old_violations, delay = idleness()
    crash_ok, crashes = crash_messages()
    hung_s = hung_gpu_other_verdict()
    print(f"probe_cpu_s={cpu_s:.2f} duty_cycle={duty:.5f} daemon_cpu_pct_with_probes={statistics.mean(with_p):.2f} "
          f"daemon_cpu_pct_without_probes={statistics.mean(without_p):.2f} sdc_detected={caught}/{injected} "
          f"false_failures={false} idle_violations={violations} idle_violations_old={old_violations} "
          f"idle_probe_delay_s={delay:.0f} crash_messages_ok={crash_ok}/{crashes} "
          f"hung_gpu_other_verdict_s={hung_s:.1f}")


if __name__ == "__main__":
    main()
