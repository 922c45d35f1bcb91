"""Footprint of `gpuwatchd run` against the stand-in driver: memory, CPU, and memory growth over a soak.

    python bench/footprint.py [--gpus 8] [--procs 32] [--cpu-seconds 20] [--soak-seconds 60]

1. RSS and CPU at the default 1 s polling: the daemon as a subprocess (`gpuwatchd run`) over 8 GPUs x 32
   processes, scraped every 15 s like a default Prometheus. RSS is daemon + NVML worker (psutil, summed); CPU is
   their combined CPU time over the window, in percent of one core. RSS, USS (pages only this process holds: what
   stopping it frees) and PSS (shared pages split among their users) are printed for the daemon and the worker
   apart (psutil ``memory_full_info``, from /proc/PID/smaps_rollup).
2. A compressed soak: polling every 50 ms (20x faster) for ``--soak-seconds`` (60 s = 20 min of 1 s polls),
   scraped every 0.75 s (20x a 15 s interval). The history is scaled by the same factor (step 5 s -> 0.25 s), and
   its retention is set to the warm-up, so the rings are full before the first measurement: the growth measured is
   what is *not* bounded by design. Growth = RSS at the end - RSS after warm-up.

The checkout's modules are byte-compiled first (:func:`compile_tree`), as ``pip install`` does: with
``PYTHONDONTWRITEBYTECODE`` set (developer shells, CI images) every start would otherwise compile all of gpuwatchd
from source, which an installed daemon never does (it cost the worker ~1.7 MB of RSS and the start ~0.1 s).

``--pci-tree`` lays the fleet's GPUs out under ``sysfs.root`` as a host's sysfs shows them, so the hot-plug scan
and the link reads (each GPU's link every poll interval) cost what they cost on a real server; without it the root
is an empty directory, as in the figures issue 20 set its goals by.

The fleet's processes are real ones by default (``--pids live``: one ``sleep`` per GPU process, so the worker reads
them through psutil as on a user's host); ``--pids dead`` lists fictitious pids instead, so every process is gone
and GpuMemoryHeldByDeadProcess fires for each: the daemon's worst case (figures before issue 20's 8x32 step were
measured so).

Last line: ``rss_mb=… cpu_pct=… rss_growth_mb=…`` (targets <= 80, <= 1, <= 1) and the split:
``daemon_rss_mb daemon_uss_mb daemon_pss_mb worker_rss_mb worker_uss_mb worker_pss_mb uss_mb pss_mb
daemon_cpu_pct worker_cpu_pct pids``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.pci_tree import mirror_sysfs  # noqa: E402
from gpuwatchd.sim.standin_abi import STATE_ENV  # noqa: E402
from gpuwatchd.sim.state import make_state, write_state  # noqa: E402

MB = 1024 * 1024
COMPRESSION = 20.0  # soak: 1 s polls -> 50 ms


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compile_tree(tree: Path) -> None:
    """Byte-compile ``tree``'s gpuwatchd package (``__pycache__``, git-ignored), as an install would have."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "gpuwatchd")], check=True,
                   stdout=subprocess.DEVNULL)


def fleet_state(gpus: int, procs: int, pids: list[int] | None = None) -> dict[str, Any]:
    """The stand-in fleet: ``gpus`` GPUs with ``procs`` compute processes each. Their pids are ``pids`` (one per
    process, GPU by GPU: :func:`live_pids`) or, without, fictitious ones (no such process on this host)."""
    state = make_state(gpus)
    for i, dev in enumerate(state["devices"]):
        dev["utilization"] = {"gpu": 70, "memory": 40}
        # 256 MiB each, less when that many would not fit (16x256: 64 MiB each on a 24 GiB GPU)
        each = min(256 * MB, (dev["memory"]["total"] // 2 // max(procs, 1)) // MB * MB)
        dev["memory"]["used"] = procs * each
        dev["processes"]["compute"] = [
            {"pid": pids[i * procs + p] if pids is not None else 10000 + i * 1000 + p, "used_memory": each,
             "name": f"worker{p}", "user": "bench"}
            for p in range(procs)
        ]
    return state


@contextlib.contextmanager
def live_pids(n: int) -> Iterator[list[int]]:
    """``n`` real processes (``sleep``), ended on exit: the fleet's GPU processes as a user's host has them.

    ``gpuwatchd run``'s worker reads the host's /proc (psutil): with fictitious pids every process is gone, so
    GpuMemoryHeldByDeadProcess fires for each and the worker never reads a process (its negative cache) -- the
    worst case of the daemon's per-process path and the best of the worker's, not a healthy host. One ``sleep``
    holds ~0.15 MB of its own (USS): 256 of them at 8x32."""
    procs = [subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


PIDS_HELP = ("live: the fleet's processes are real (sleep) processes, as on a user's host; dead: fictitious pids, so "
             "every process is gone and GpuMemoryHeldByDeadProcess fires for each (the daemon's worst case, the "
             "figure measured before issue 20's 8x32 step)")


def add_pids_option(ap: argparse.ArgumentParser) -> None:
    """``--pids live|dead`` (default live), shared by the benches that build a fleet with :func:`fleet`."""
    ap.add_argument("--pids", choices=("live", "dead"), default="live", help=PIDS_HELP)


PCI_TREE_HELP = ("lay out the fleet's GPUs as a host's sysfs shows them (sim/pci_tree.mirror_sysfs: each GPU's PCI "
                 "function with its link files), so the daemon's hot-plug scan and link reads cost what they cost on "
                 "a real server; without it sysfs.root is an empty directory, as in the figures issue 20 set its "
                 "goals by")


def add_pci_tree_option(ap: argparse.ArgumentParser) -> None:
    """``--pci-tree``, shared by the benches that build a fleet: see :data:`PCI_TREE_HELP`."""
    ap.add_argument("--pci-tree", action="store_true", help=PCI_TREE_HELP)


def sysfs_root(tmp: Path, state: dict[str, Any], pci_tree: bool) -> Path:
    """The ``sysfs.root`` for a fleet's daemons: with ``pci_tree``, the fleet's GPUs mirrored under it."""
    root = tmp / "sysfs"
    if pci_tree:
        mirror_sysfs(root, state)
    return root


@contextlib.contextmanager
def fleet(gpus: int, procs: int, pids: str = "live") -> Iterator[dict[str, Any]]:
    """:func:`fleet_state` with live pids (:func:`live_pids`, ended on exit) or, for ``pids="dead"``, fictitious
    ones."""
    if pids == "live":
        with live_pids(gpus * procs) as live:
            yield fleet_state(gpus, procs, live)
    else:
        yield fleet_state(gpus, procs)


class Daemon:
    def __init__(self, tmp: Path, name: str, state_path: Path, config: dict[str, Any], tree: Path = ROOT) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg_path = tmp / f"{name}.yml"
        cfg_path.write_text(yaml.safe_dump({"state_dir": str(tmp / f"{name}-state"), **config}))
        env = {**os.environ, STATE_ENV: str(state_path), "PYTHONPATH": str(tree)}
        self.log = (tmp / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "run", "--config", str(cfg_path), "--listen", f"127.0.0.1:{self.port}"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tree,
        )
        self.ps = psutil.Process(self.proc.pid)

    def scrape(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def wait_for_gpus(self, gpus: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited with {self.proc.returncode}")
            try:
                if f"gpuwatchd_gpus {gpus:.1f}" in self.scrape():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("daemon did not report the GPUs in time")

    def processes(self) -> list[psutil.Process]:
        return [self.ps, *self.ps.children(recursive=True)]

    def rss(self) -> int:
        total = 0
        for p in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):  # a worker being replaced
                total += p.memory_info().rss
        return total

    def memory(self) -> dict[str, dict[str, float]]:
        """RSS, USS and PSS in MB of the daemon and of its NVML worker (other children, if any, as ``other``)."""
        out: dict[str, dict[str, float]] = {}
        for p in self.processes():
            try:
                role = "daemon" if p.pid == self.ps.pid else (
                    "worker" if any(a.startswith("gpuwatchd.") and "worker" in a for a in p.cmdline()) else "other")
                m = p.memory_full_info()
            except psutil.NoSuchProcess:  # a worker being replaced
                continue
            acc = out.setdefault(role, {"rss": 0.0, "uss": 0.0, "pss": 0.0})
            acc["rss"] += m.rss / MB
            acc["uss"] += m.uss / MB
            acc["pss"] += m.pss / MB
        return out

    def cpu_seconds(self) -> float:
        return sum(self.cpu_split())

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds of the daemon and of its children (the NVML worker; replaced workers count through
        children_user/system of the daemon)."""
        t = self.ps.cpu_times()
        children = t.children_user + t.children_system
        for p in self.ps.children(recursive=True):
            try:
                c = p.cpu_times()
                children += c.user + c.system
            except psutil.NoSuchProcess:
                pass
        return t.user + t.system, children

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_for(d: Daemon, seconds: float, scrape_every: float) -> None:
    end = time.monotonic() + seconds
    next_scrape = time.monotonic()
    while (now := time.monotonic()) < end:
        if now >= next_scrape:
            d.scrape()
            next_scrape += scrape_every
        time.sleep(max(0.0, min(next_scrape, end) - time.monotonic()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32, help="processes per GPU")
    ap.add_argument("--cpu-seconds", type=float, default=20.0)
    ap.add_argument("--soak-seconds", type=float, default=60.0)
    ap.add_argument("--warmup-seconds", type=float, default=10.0)
    ap.add_argument("--top-n", type=int, help="processes.top_n (default: the config's; 256: every process at 16x256)")
    add_pci_tree_option(ap)
    add_pids_option(ap)
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="the gpuwatchd checkout to run (default: this one; another for a before/after)")
    args = ap.parse_args()

    libdir = build_standin()
    compile_tree(args.tree.resolve())
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwatchd-bench-")))
        state_path = tmp / "sim-state"
        state = stack.enter_context(fleet(args.gpus, args.procs, args.pids))
        write_state(state_path, state)
        print(f"fleet: {args.gpus} GPUs x {args.procs} processes, pids {args.pids}"
              f"{', PCI tree' if args.pci_tree else ''}", flush=True)
        base: dict[str, Any] = {"nvml": {"library_path": str(libdir)},
                                "sysfs": {"root": str(sysfs_root(tmp, state, args.pci_tree))}}
        if args.top_n is not None:
            base["processes"] = {"top_n": args.top_n}

        # 1. 1 s polling: RSS and CPU.
        d = Daemon(tmp, "steady", state_path, {**base, "nvml": {**base["nvml"], "poll_interval": "1s"}},
                   args.tree.resolve())
        try:
            d.wait_for_gpus(args.gpus)
            run_for(d, args.warmup_seconds, 15.0)
            t0, (dc0, wc0) = time.monotonic(), d.cpu_split()
            run_for(d, args.cpu_seconds, 15.0)
            dc1, wc1 = d.cpu_split()
            span = time.monotonic() - t0
            daemon_cpu, worker_cpu = 100.0 * (dc1 - dc0) / span, 100.0 * (wc1 - wc0) / span
            cpu_pct = daemon_cpu + worker_cpu
            rss = d.rss()
            mem = d.memory()
            print(f"steady: {len(d.processes())} processes, rss {rss / MB:.1f} MB, cpu {cpu_pct:.2f}% of one core"
                  f" (daemon {daemon_cpu:.2f}, worker {worker_cpu:.2f})")
            for role, m in mem.items():
                print(f"  {role}: rss {m['rss']:.1f} MB, uss {m['uss']:.1f} MB, pss {m['pss']:.1f} MB")
        finally:
            d.stop()

        # 2. Compressed soak.
        step = 5.0 / COMPRESSION
        soak_cfg = {
            **base,
            "nvml": {**base["nvml"], "poll_interval": f"{1000 / COMPRESSION:g}ms"},
            "history": {"step": f"{step * 1000:g}ms", "retention": f"{args.warmup_seconds:g}s"},
        }
        d = Daemon(tmp, "soak", state_path, soak_cfg, args.tree.resolve())
        try:
            d.wait_for_gpus(args.gpus)
            run_for(d, args.warmup_seconds * 1.5, 15.0 / COMPRESSION)
            rss_start = d.rss()
            run_for(d, args.soak_seconds, 15.0 / COMPRESSION)
            rss_end = d.rss()
            growth = (rss_end - rss_start) / MB
            polls = args.soak_seconds * COMPRESSION
            print(
                f"soak: {args.soak_seconds:g} s at {1000 / COMPRESSION:g} ms polls "
                f"(~{polls / 60:.0f} min of 1 s polls), "
                f"rss {rss_start / MB:.1f} -> {rss_end / MB:.1f} MB"
            )
        finally:
            d.stop()
    split = " ".join(f"{role}_{k}_mb={mem.get(role, {}).get(k, 0.0):.1f}"
                     for role in ("daemon", "worker") for k in ("rss", "uss", "pss"))
    uss = sum(m["uss"] for m in mem.values())
    pss = sum(m["pss"] for m in mem.values())
    print(f"rss_mb={rss / MB:.1f} cpu_pct={cpu_pct:.2f} rss_growth_mb={growth:.2f} {split} uss_mb={uss:.1f}"
          f" pss_mb={pss:.1f} daemon_cpu_pct={daemon_cpu:.2f} worker_cpu_pct={worker_cpu:.2f} pids={args.pids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
