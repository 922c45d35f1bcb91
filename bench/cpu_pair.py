"""CPU of the daemon and its NVML worker, this tree beside a baseline tree, on one live fleet at the same time.

    python bench/cpu_pair.py --baseline /path/to/other/checkout [--gpus 16 --procs 256 --top-n 256] [--rounds 3]
        [--pci-tree]

Both daemons run together against the same stand-in fleet of real processes (``footprint.fleet``), with 1 s
polling, so the machine's load hits both alike; each round starts them in the other order, half a poll interval
apart, so that neither polls right after the other on caches the other warmed (the code both processes map). CPU
is on-CPU time from ``/proc/PID/task/*/schedstat`` (nanoseconds; ``footprint.py`` reads psutil's 10 ms ticks),
summed over the daemon's threads and over its worker's, over ``--seconds`` after ``--settle-seconds``.
The last line: this tree's and the baseline's median % of a core (daemon + worker, and each), and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from footprint import Daemon, add_pci_tree_option, compile_tree, fleet, sysfs_root  # noqa: E402

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.state import write_state  # noqa: E402


def on_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of every thread of ``pid`` (0 for one gone meanwhile)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


STAGGER_SECONDS = 0.5  # half the 1 s poll interval


def split_ns(d: Daemon) -> tuple[int, int]:
    """(daemon, its children: the NVML worker) on-CPU nanoseconds."""
    procs = d.processes()
    return on_cpu_ns(procs[0].pid), sum(on_cpu_ns(p.pid) for p in procs[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32, help="processes per GPU")
    ap.add_argument("--top-n", type=int, help="processes.top_n (default: the config's)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle-seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    add_pci_tree_option(ap)
    args = ap.parse_args()

    trees = {"this": ROOT, "base": args.baseline.resolve()}
    libdir = build_standin()
    for tree in trees.values():
        compile_tree(tree)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-cpu-pair-") as tmp_name, \
            fleet(args.gpus, args.procs, "live") as state:
        tmp = Path(tmp_name)
        state_path = tmp / "sim-state"
        write_state(state_path, state)
        config: dict[str, object] = {"nvml": {"library_path": str(libdir), "poll_interval": "1s"},
                                     "sysfs": {"root": str(sysfs_root(tmp, state, args.pci_tree))}}
        if args.top_n is not None:
            config["processes"] = {"top_n": args.top_n}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            daemons = {}
            for name in order:
                # Half a poll interval apart: polls that ran back to back found the code the two processes share
                # (libpython, the stand-in) warm in the CPU's caches for the second one, and the one started
                # first measured up to 0.1 % of a core more at 8x32 whichever tree it was.
                if daemons:
                    time.sleep(STAGGER_SECONDS)
                daemons[name] = Daemon(tmp, f"{name}{r}", state_path, config, trees[name])
            try:
                for d in daemons.values():
                    d.wait_for_gpus(args.gpus)
                time.sleep(args.settle_seconds)
                start = {name: split_ns(d) for name, d in daemons.items()}
                t0 = time.monotonic()
                time.sleep(args.seconds)
                end = {name: split_ns(d) for name, d in daemons.items()}
                span = time.monotonic() - t0
            finally:
                for d in daemons.values():
                    d.stop()
            line = []
            for name in trees:
                daemon_pct = (end[name][0] - start[name][0]) / span / 1e7
                worker_pct = (end[name][1] - start[name][1]) / span / 1e7
                figures[name].append((daemon_pct, worker_pct))
                line.append(f"{name} {daemon_pct + worker_pct:.2f} % "
                            f"(daemon {daemon_pct:.2f}, worker {worker_pct:.2f})")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
    out = {}
    for name, rows in figures.items():
        out[f"{name}_cpu_pct"] = statistics.median(d + w for d, w in rows)
        out[f"{name}_daemon_cpu_pct"] = statistics.median(d for d, _ in rows)
        out[f"{name}_worker_cpu_pct"] = statistics.median(w for _, w in rows)
    out["ratio"] = out["this_cpu_pct"] / out["base_cpu_pct"] if out["base_cpu_pct"] else float("nan")
    print(f"fleet: {args.gpus} GPUs x {args.procs} processes, live pids, top_n {args.top_n or 'default'}, "
          f"{'PCI tree, ' if args.pci_tree else ''}{args.rounds} rounds of {args.seconds:g} s")
    print(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
