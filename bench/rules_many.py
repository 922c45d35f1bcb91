"""CPU of one rules evaluation with thousands of firing alerts whose inputs do not change: every process on 16 GPUs
x 256 (``top_n: 256``) gone while its memory is still held, so GpuMemoryHeldByDeadProcess fires for each (4,096
alerts; what ``bench/footprint.py --pids dead`` and ``bench/gc_tail.py --dead`` run into), in-process.

    python bench/rules_many.py [--gpus 16] [--procs 256] [--evaluations 120] [--rounds 2] [--tree OTHER_CHECKOUT]

A real ``Store`` gets one snapshot a second (the process objects kept from poll to poll, as the daemon's decoder
keeps an unchanged process; each GPU sample new) and a real ``RulesEngine`` with the default rules evaluates after
each, as the daemon does. The first 130 s (the alerts' ``for:`` of 120 s) are not counted; then ``--evaluations``
evaluations are timed (``time.thread_time``: CPU of this thread, so a loaded machine inflates it less than wall
time; the collector tuned as in the daemon, ``runtime/gc_tuning``, its 30 s collection untimed): median, p90 and
max in ms, and apart the median of the evaluations at which the dead-process family ran again (every
``rules.dead_process.interval``, 10 s), and the median of the evaluations between 20 and 120 s while the alerts
are pending (what a young daemon runs, as under ``gc_tail.py --dead``; the family's runs left out). Each tree
runs in its own child process; with ``--tree`` the other checkout runs too, the two alternated ``--rounds`` times.
The last line holds the figures as name=value pairs (the best round of each; ``old_`` for ``--tree``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_764_000_000.0
WARMUP = 130
PENDING = 20  # from here to 10 s before WARMUP, the alerts are pending (timed apart)
GIB = 1 << 30


def child(gpus: int, procs: int, evaluations: int) -> dict[str, float]:
    from gpuwatchd.model import GpuSample, ProcessSample, Snapshot
    from gpuwatchd.rules.config import RulesConfig
    from gpuwatchd.rules.engine import RulesEngine
    from gpuwatchd.runtime.gc_tuning import FREEZE_INTERVAL_SECONDS, freeze_survivors, hold_full_collections
    from gpuwatchd.store import Store

    uuids = [f"GPU-{g:08x}-5a3c-4000-8000-{g:012x}" for g in range(gpus)]
    processes = {
        u: tuple(ProcessSample(pid=100_000 + g * 1000 + i, used_memory_bytes=(64 + i) << 20, name="python",
                               user="alice", host_state="gone", host_state_seconds=30.0, host_state_at=T0)
                 for i in range(procs))
        for g, u in enumerate(uuids)
    }

    def snapshot(t: float) -> Snapshot:
        gs = []
        for g, u in enumerate(uuids):
            used = sum(p.used_memory_bytes or 0 for p in processes[u]) + (300 << 20)
            gs.append(GpuSample(uuid=u, index=g, name="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{g + 16:02X}:00.0",
                                memory_total_bytes=80 * GIB, memory_used_bytes=used,
                                memory_free_bytes=80 * GIB - used, utilization_gpu_ratio=0.0,
                                temperature_celsius=40.0, power_watts=70.0, processes=processes[u],
                                processes_total=procs))
        return Snapshot(timestamp=t, nvml_ok=True, gpus=tuple(gs), host_pid_namespace=True)

    store = Store()
    engine = RulesEngine(RulesConfig(), host="node1")
    times: list[float] = []
    reran: list[float] = []
    pending: list[float] = []
    firing = 0
    for i in range(WARMUP + evaluations):
        t = T0 + i
        if i >= WARMUP and (i - WARMUP) % FREEZE_INTERVAL_SECONDS == 0:  # as the daemon's keep_frozen, untimed
            freeze_survivors(2)
            hold_full_collections()
        store.apply(snapshot(t))
        c0 = time.thread_time()
        alerts = engine.evaluate(store, t)
        ms = (time.thread_time() - c0) * 1000
        if PENDING <= i < WARMUP - 10 and i % 10 != 0:
            pending.append(ms)
        if i >= WARMUP:
            (reran if i % 10 == 0 else times).append(ms)
            firing = sum(a.state == "firing" for a in alerts)
    return {
        "median_ms": statistics.median(times),
        "p90_ms": statistics.quantiles(times, n=10)[-1],
        "max_ms": max(times),
        "dead_family_ms": statistics.median(reran) if reran else 0.0,
        "pending_median_ms": statistics.median(pending),
        "firing": firing,
    }


def run_tree(tree: Path, a: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--gpus", str(a.gpus), "--procs", str(a.procs),
         "--evaluations", str(a.evaluations)],
        env=env, cwd=tree, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--evaluations", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="another gpuwatchd checkout to run side by side (the baseline)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.gpus, a.procs, a.evaluations)))
        return 0
    trees = [("", ROOT)] + ([("old_", a.tree.resolve())] if a.tree is not None else [])
    results: dict[str, list[dict[str, float]]] = {p: [] for p, _ in trees}
    for r in range(a.rounds):
        for prefix, tree in trees if r % 2 == 0 else trees[::-1]:
            res = run_tree(tree, a)
            results[prefix].append(res)
            print(f"round {r + 1} {tree}: " + " ".join(f"{k}={v:.2f}" for k, v in res.items()), flush=True)
    figures = []
    for prefix, _ in trees:
        rs = results[prefix]
        for k in ("median_ms", "p90_ms", "max_ms", "dead_family_ms", "pending_median_ms"):
            figures.append(f"{prefix}{k}={min(x[k] for x in rs):.2f}")
        figures.append(f"{prefix}firing={int(rs[-1]['firing'])}")
    print(" ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
