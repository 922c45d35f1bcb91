"""Start-up of the command line and the daemon, optionally side by side with another checkout (the previous commit).

    python bench/startup.py [--rounds 7] [--baseline DIR] [--pids live|dead]

Per round, in a fresh interpreter each: the wall time of ``gpuwatchd --help`` (``python -m gpuwatchd --help``) and
of ``gpuwatchd run`` from the process start to the first 200 on ``/metrics`` (the stand-in driver, 8 GPUs x 32
processes, real ``sleep`` ones by default as in bench/footprint.py; ``--pids dead``: fictitious pids). With
``--baseline DIR`` (e.g. ``git worktree add /tmp/prev HEAD~1``) the same runs of that tree alternate with these, so a
machine that is busier in one part of the run skews both alike; the ratios (this / baseline) are the figure to quote
on a shared machine. Then a per-import breakdown of the daemon (RSS and CPU each step adds, in one fresh
interpreter), to show where start-up goes.

The daemon's own CPU seconds up to that 200 (``cpu_to_200_s``) are printed too: on a loaded machine they move far
less than the wall time.

Last line: ``help_s=… first_200_s=… cpu_to_200_s=…`` (medians; targets <= 0.15 and <= 0.2 wall), plus the
``base_…`` figures and ``…_ratio`` (this / baseline, the median of the per-round ratios) with a baseline, then
``pids=live|dead``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from footprint import add_pids_option, compile_tree, fleet, free_port  # noqa: E402

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.standin_abi import STATE_ENV  # noqa: E402
from gpuwatchd.sim.state import write_state  # noqa: E402

# Each step is imported after the ones before it: what it adds on top of them.
IMPORT_STEPS = ("asyncio", "yaml", "msgspec", "gpuwatchd.config.loader", "aiohttp", "aiohttp.web",
                "prometheus_client", "gpuwatchd.model", "gpuwatchd.exporter.collector",
                "gpuwatchd.notify.dispatcher", "gpuwatchd.rules.engine", "gpuwatchd.daemon")
_STEPS_SCRIPT = """
import importlib, sys, time
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith('VmRSS'))
print(f"interpreter {rss():.1f} MB")
for m in sys.argv[1:]:
    r0, t0 = rss(), time.process_time()
    importlib.import_module(m)
    print(f"  + {m:32s} {rss() - r0:5.1f} MB {(time.process_time() - t0) * 1000:5.0f} ms cpu")
print(f"after all: {rss():.1f} MB")
"""


def _env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), **(extra or {})}


def time_help(tree: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuwatchd", "--help"], env=_env(tree), cwd=tree,
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (its own, not its children's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_first_200(tree: Path, tmp: Path, state_path: Path, libdir: Path,
                   timeout: float = 60.0) -> tuple[float, float]:
    """Wall seconds from the start to the first 200 on /metrics, and the daemon's CPU seconds by then."""
    port = free_port()
    cfg = tmp / f"startup-{port}.yml"
    cfg.write_text(yaml.safe_dump({"state_dir": str(tmp / f"state-{port}"), "nvml": {"library_path": str(libdir)},
                                   "sysfs": {"root": str(tmp / "sysfs")}}))
    url = f"http://127.0.0.1:{port}/metrics"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "run", "--config", str(cfg), "--listen",
                             f"127.0.0.1:{port}"], env=_env(tree, {STATE_ENV: str(state_path)}), cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{tree}: the daemon exited with {proc.returncode} before serving /metrics")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"{tree}: no 200 on /metrics within {timeout:g} s")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0, _cpu_s(proc.pid)
            except (urllib.error.URLError, OSError):
                time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def import_steps(tree: Path) -> str:
    out = subprocess.run([sys.executable, "-c", _STEPS_SCRIPT, *IMPORT_STEPS], env=_env(tree), cwd=tree,
                         capture_output=True, text=True, check=True)
    return out.stdout.rstrip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", type=Path, help="another checkout of gpuwatchd to run side by side")
    add_pids_option(ap)
    args = ap.parse_args()
    trees = {"this": ROOT}
    if args.baseline is not None:
        trees["base"] = args.baseline.resolve()
    libdir = build_standin()
    for tree in trees.values():  # as installed: byte-compiled (bench/footprint.py, compile_tree)
        compile_tree(tree)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"help": [], "first_200": [], "cpu_to_200": []} for name in trees
    }
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-startup-") as tmp_name, fleet(8, 32, args.pids) as state:
        tmp = Path(tmp_name)
        state_path = tmp / "sim-state"
        write_state(state_path, state)
        for tree in trees.values():  # warm-up: page cache
            time_help(tree)
            time_first_200(tree, tmp, state_path, libdir)
        for _ in range(args.rounds):
            for name, tree in trees.items():
                figures[name]["help"].append(time_help(tree))
                wall, cpu = time_first_200(tree, tmp, state_path, libdir)
                figures[name]["first_200"].append(wall)
                figures[name]["cpu_to_200"].append(cpu)
    med = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    for name, f in figures.items():
        for k, v in f.items():
            print(f"{name} {k}: median {statistics.median(v):.3f} s (min {min(v):.3f}, max {max(v):.3f}, "
                  f"{len(v)} rounds)")
    for name, tree in trees.items():
        print(f"{name} imports of the daemon, each on top of the ones before ({tree}):")
        print(import_steps(tree))
    line = (f"help_s={med['this']['help']:.3f} first_200_s={med['this']['first_200']:.3f}"
            f" cpu_to_200_s={med['this']['cpu_to_200']:.3f}")
    if "base" in med:
        ratios = {k: statistics.median(a / b for a, b in zip(figures["this"][k], figures["base"][k], strict=True))
                  for k in ("help", "first_200", "cpu_to_200")}
        line += (f" base_help_s={med['base']['help']:.3f} base_first_200_s={med['base']['first_200']:.3f}"
                 f" base_cpu_to_200_s={med['base']['cpu_to_200']:.3f} help_ratio={ratios['help']:.2f}"
                 f" first_200_ratio={ratios['first_200']:.2f} cpu_to_200_ratio={ratios['cpu_to_200']:.2f}")
    print(f"{line} pids={args.pids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
