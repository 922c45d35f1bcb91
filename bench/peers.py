"""gpuwatchd side by side with its peers (nvitop-exporter, glances) on one stand-in fleet, all running at once.

    python bench/peers.py [--gpus 8] [--procs 32] [--rounds 3] [--seconds 30] [--pids live|dead] [--bin-dir DIR]

Every tool reads the same stand-in ``libnvidia-ml.so.1`` (``LD_LIBRARY_PATH`` for the peers, which load the library
by name through nvidia-ml-py; the config's ``nvml.library_path`` for gpuwatchd) and the same simulated state
(``GPUWATCHD_SIM_STATE``), polling every second. Per round of ``--seconds``: each tool's CPU (its process tree, in
percent of one core) and the latency of a scrape every ``--scrape-every`` seconds (``/metrics``; glances has no
Prometheus endpoint of its own without a config, so its REST ``/api/4/gpu``); after each round RSS, USS and PSS of
each tree (psutil ``memory_full_info``). Medians over the rounds are printed with the ratio gpuwatchd / peer (below
1: gpuwatchd is lighter or faster). Start-up is the time from the process start to the first answer that holds the
whole fleet, measured while all tools start at once.

The fleet's processes are real ones by default (``--pids live``: one ``sleep`` per GPU process, bench/footprint.py's
:func:`fleet`), so every tool finds them on the host as on a user's; ``--pids dead`` lists fictitious pids, every
process gone (gpuwatchd's worst case: GpuMemoryHeldByDeadProcess for each).

The peers are not dependencies of the project: install them where you like (``python -m venv /tmp/peers &&
/tmp/peers/bin/pip install nvitop-exporter 'glances[web]'``) and pass ``--bin-dir /tmp/peers/bin``, or have them on
PATH. A peer that is not installed or does not come up is reported as skipped, with why, and left out.

Last line: ``name=value`` pairs: ``<tool>_cpu_pct``, ``<tool>_rss_mb``, ``<tool>_uss_mb``, ``<tool>_p99_ms``,
``<tool>_max_ms``, ``<tool>_ready_s`` per tool that ran (tool names with ``_``), and ``<figure>_ratio_<peer>``
(gpuwatchd / peer) for cpu_pct, rss_mb, uss_mb and p99_ms, then ``pids=live|dead``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from footprint import add_pids_option, compile_tree, fleet, free_port  # noqa: E402

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.standin_abi import STATE_ENV  # noqa: E402
from gpuwatchd.sim.state import write_state  # noqa: E402

MB = 1024 * 1024
FIGURES = ("cpu_pct", "rss_mb", "uss_mb", "pss_mb", "p99_ms", "max_ms")


@dataclass
class Tool:
    name: str
    argv: list[str]
    url: str
    ready: Callable[[bytes], bool]  # the answer holds the whole fleet
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    started: float = 0.0
    ready_s: float | None = None
    skipped: str | None = None
    latencies: list[float] = field(default_factory=list)
    rounds: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in FIGURES})

    def tree(self) -> list[psutil.Process]:
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
                if p.pid == self.proc.pid:  # type: ignore[union-attr]
                    total += t.children_user + t.children_system  # children that ended
        return total

    def memory_mb(self) -> dict[str, float]:
        out = {"rss_mb": 0.0, "uss_mb": 0.0, "pss_mb": 0.0}
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                m = p.memory_full_info()
                out["rss_mb"] += m.rss / MB
                out["uss_mb"] += m.uss / MB
                out["pss_mb"] += m.pss / MB
        return out

    def fetch(self) -> bytes:
        with urllib.request.urlopen(self.url, timeout=30) as r:
            return bytes(r.read())

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _find(name: str, bin_dir: Path | None) -> str | None:
    if bin_dir is not None and (bin_dir / name).is_file():
        return str(bin_dir / name)
    return shutil.which(name)


def _glances_ready(gpus: int) -> Callable[[bytes], bool]:
    def ready(body: bytes) -> bool:
        try:
            doc = json.loads(body)
        except ValueError:
            return False
        return isinstance(doc, list) and len(doc) == gpus

    return ready


def make_tools(args: argparse.Namespace, tmp: Path, libdir: Path, state_path: Path, last_uuid: str) -> list[Tool]:
    peer_env = {**os.environ, STATE_ENV: str(state_path),
                "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(libdir), os.environ.get("LD_LIBRARY_PATH")) if p)}
    tools = []
    port = free_port()
    cfg = tmp / "gpuwatchd.yml"
    config = {"state_dir": str(tmp / "gpuwatchd-state"), "sysfs": {"root": str(tmp / "sysfs")},
              "nvml": {"library_path": str(libdir), "poll_interval": "1s"}}
    if args.top_n is not None:
        config["processes"] = {"top_n": args.top_n}
    cfg.write_text(yaml.safe_dump(config))
    tools.append(Tool("gpuwatchd", [sys.executable, "-m", "gpuwatchd", "run", "--config", str(cfg), "--listen",
                                    f"127.0.0.1:{port}"], f"http://127.0.0.1:{port}/metrics",
                      lambda b: f"gpuwatchd_gpus {args.gpus:.1f}".encode() in b,
                      {**os.environ, STATE_ENV: str(state_path), "PYTHONPATH": str(ROOT)}))
    exe = _find("nvitop-exporter", args.bin_dir)
    port = free_port()
    nvitop = Tool("nvitop-exporter", [exe or "nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port),
                                      "--interval", "1"], f"http://127.0.0.1:{port}/metrics",
                  lambda b: last_uuid.encode() in b, peer_env)
    nvitop.skipped = None if exe else "not installed (pip install nvitop-exporter; --bin-dir or PATH)"
    tools.append(nvitop)
    exe = _find("glances", args.bin_dir)
    port = free_port()
    glances = Tool("glances", [exe or "glances", "-w", "--disable-webui", "--bind", "127.0.0.1", "--port", str(port),
                               "-t", "1", "--disable-plugin", "all", "--enable-plugin", "gpu"],
                   f"http://127.0.0.1:{port}/api/4/gpu", _glances_ready(args.gpus), peer_env)
    glances.skipped = None if exe else "not installed (pip install 'glances[web]'; --bin-dir or PATH)"
    tools.append(glances)
    return tools


def start(tools: list[Tool], tmp: Path, timeout: float) -> None:
    for t in tools:
        if t.skipped:
            continue
        t.log = tmp / f"{t.name}.log"
        with t.log.open("wb") as log:
            t.started = time.perf_counter()
            t.proc = subprocess.Popen(t.argv, env=t.env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    end = time.monotonic() + timeout
    waiting = [t for t in tools if t.proc is not None]
    while waiting and time.monotonic() < end:
        for t in list(waiting):
            assert t.proc is not None
            if t.proc.poll() is not None:
                t.skipped = f"exited with {t.proc.returncode} at start: {_last_line(t.log)}"
                waiting.remove(t)
                continue
            try:
                if t.ready(t.fetch()):
                    t.ready_s = time.perf_counter() - t.started
                    waiting.remove(t)
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.05)
    for t in waiting:
        t.skipped = f"did not report {t.url} with the whole fleet within {timeout:g} s: {_last_line(t.log)}"
        t.stop()
    if tools[0].skipped:
        raise SystemExit(f"gpuwatchd did not come up: {tools[0].skipped}")


def _last_line(log: Path | None) -> str:
    if log is None or not log.exists():
        return "no output"
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else "no output"


def one_round(tools: list[Tool], seconds: float, scrape_every: float) -> None:
    live = [t for t in tools if not t.skipped]
    cpu0 = {t.name: t.cpu_seconds() for t in live}
    lat: dict[str, list[float]] = {t.name: [] for t in live}
    t0 = time.monotonic()
    next_scrape = t0
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_scrape:
            for t in live:
                s = time.perf_counter()
                with contextlib.suppress(urllib.error.URLError, OSError):
                    t.fetch()
                    lat[t.name].append(time.perf_counter() - s)
            next_scrape += scrape_every
        time.sleep(max(0.0, min(next_scrape, t0 + seconds) - time.monotonic()))
    wall = time.monotonic() - t0
    for t in live:
        t.rounds["cpu_pct"].append(100.0 * (t.cpu_seconds() - cpu0[t.name]) / wall)
        for k, v in t.memory_mb().items():
            t.rounds[k].append(v)
        ms = sorted(x * 1000 for x in lat[t.name]) or [float("nan")]
        t.rounds["p99_ms"].append(ms[min(len(ms) - 1, int(0.99 * len(ms)))])
        t.rounds["max_ms"].append(ms[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32, help="processes per GPU")
    ap.add_argument("--top-n", type=int, help="gpuwatchd's processes.top_n (default: the config's; 256 for 16x256)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0, help="length of a round")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds after every tool is up, before round 1")
    ap.add_argument("--scrape-every", type=float, default=1.0)
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--bin-dir", type=Path, help="where nvitop-exporter and glances are (default: PATH)")
    add_pids_option(ap)
    args = ap.parse_args()

    libdir = build_standin()
    compile_tree(ROOT)  # as installed: byte-compiled (bench/footprint.py)
    with (tempfile.TemporaryDirectory(prefix="gpuwatchd-peers-") as tmp_name,
          fleet(args.gpus, args.procs, args.pids) as state):
        tmp = Path(tmp_name)
        state_path = tmp / "sim-state"
        write_state(state_path, state)
        tools = make_tools(args, tmp, libdir, state_path, str(state["devices"][-1]["uuid"]))
        try:
            start(tools, tmp, args.start_timeout)
            time.sleep(args.warmup)
            for r in range(args.rounds):
                one_round(tools, args.seconds, args.scrape_every)
                print(f"round {r + 1}: " + ", ".join(
                    f"{t.name} cpu {t.rounds['cpu_pct'][-1]:.2f}% rss {t.rounds['rss_mb'][-1]:.1f} MB"
                    f" p99 {t.rounds['p99_ms'][-1]:.1f} ms" for t in tools if not t.skipped), flush=True)
        finally:
            for t in tools:
                t.stop()
    print(f"{args.gpus} GPUs x {args.procs} processes (pids {args.pids}), 1 s polling, {args.rounds} rounds of "
          f"{args.seconds:g} s, all tools at once; medians over the rounds:")
    print(f"{'tool':16s} {'cpu %':>7s} {'rss MB':>7s} {'uss MB':>7s} {'pss MB':>7s} {'p99 ms':>8s} {'max ms':>8s}"
          f" {'ready s':>8s}")
    med: dict[str, dict[str, float]] = {}
    for t in tools:
        if t.skipped:
            print(f"{t.name:16s} skipped: {t.skipped}")
            continue
        med[t.name] = {k: statistics.median(v) for k, v in t.rounds.items()}
        med[t.name]["ready_s"] = t.ready_s or float("nan")
        m = med[t.name]
        print(f"{t.name:16s} {m['cpu_pct']:7.2f} {m['rss_mb']:7.1f} {m['uss_mb']:7.1f} {m['pss_mb']:7.1f}"
              f" {m['p99_ms']:8.1f} {m['max_ms']:8.1f} {m['ready_s']:8.2f}")
    pairs = []
    for name, m in med.items():
        key = name.replace("-", "_")
        pairs += [f"{key}_{k}={m[k]:.2f}" for k in ("cpu_pct", "rss_mb", "uss_mb", "p99_ms", "max_ms", "ready_s")]
    ours = med["gpuwatchd"]
    for name, m in med.items():
        if name == "gpuwatchd":
            continue
        key = name.replace("-", "_")
        for k in ("cpu_pct", "rss_mb", "uss_mb", "p99_ms"):
            ratio = ours[k] / m[k] if m[k] else float("nan")
            pairs.append(f"{k}_ratio_{key}={ratio:.2f}")
    pairs.append(f"pids={args.pids}")
    print(" ".join(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
