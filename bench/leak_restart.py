"""The first leak evaluation after a restart with a full hour of restored history, with and without the flat-series
memo primed at the restore (``rules.leak.prime``, which the daemon calls after loading the rule history).

    python bench/leak_restart.py [--gpus 16 --procs 256] [--rounds 3]

A store restored with ``--gpus`` x ``--procs`` flat process series of an hour at the 5 s step (720 points each: the
steady processes of a live host), then one poll, then the leak family's conditions (what the first evaluation
runs on the event loop), then the next. CPU time (``time.process_time``) of each. The last line: medians over the
rounds, and the first evaluation's ratio primed / not primed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot  # noqa: E402
from gpuwatchd.rules import leak  # noqa: E402
from gpuwatchd.rules.config import RulesConfig  # noqa: E402
from gpuwatchd.rules.leak.flat import FlatSeries  # noqa: E402
from gpuwatchd.store import GpuPoint, ProcessPoint, Store  # noqa: E402

GIB = 1 << 30
T0, STEP, POINTS = 1_764_000_000.0, 5.0, 720


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--procs", type=int, default=256, help="process series per GPU")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    uuids = [f"GPU-{g:08x}-5a3c-4000-8000-{g:012x}" for g in range(args.gpus)]
    pids = {u: [1000 + g * 1000 + i for i in range(args.procs)] for g, u in enumerate(uuids)}
    ts = [T0 + STEP * i for i in range(POINTS)]
    gpus = {u: [GpuPoint(t, 40 * GIB, 80 * GIB, 38 * GIB, None, None, None, None, {}, None, None, None) for t in ts]
            for u in uuids}
    procs = {(u, p): [ProcessPoint(t, 2 * GIB, 3 * GIB) for t in ts] for u in uuids for p in pids[u]}

    def snap(t: float) -> Snapshot:
        return Snapshot(timestamp=t, nvml_ok=True, gpus=tuple(
            GpuSample(uuid=u, index=g, memory_total_bytes=80 * GIB, memory_used_bytes=40 * GIB, processes_total=len(
                pids[u]), processes=tuple(ProcessSample(pid=p, used_memory_bytes=2 * GIB, host_rss_bytes=3 * GIB)
                                          for p in pids[u])) for g, u in enumerate(uuids)))

    config = RulesConfig()
    got: dict[str, list[float]] = {k: [] for k in ("cold_first", "primed_first", "prime", "next")}
    for _ in range(args.rounds):
        for primed in (False, True):
            store = Store()
            store.restore_history(gpus, procs)
            leak._FLAT = FlatSeries()
            c = time.process_time()
            if primed:
                leak.prime(store, config.leak.host_rss)
                got["prime"].append(time.process_time() - c)
            now = ts[-1] + STEP
            store.apply(snap(now))
            c = time.process_time()
            leak.conditions(store, now, config)
            got["primed_first" if primed else "cold_first"].append(time.process_time() - c)
            store.apply(snap(now + 15))
            c = time.process_time()
            leak.conditions(store, now + 15, config)
            got["next"].append(time.process_time() - c)
    ms = {k: statistics.median(v) * 1000 for k, v in got.items()}
    print(f"{args.gpus}x{args.procs}, {POINTS} points a series: first evaluation {ms['cold_first']:.1f} ms cold, "
          f"{ms['primed_first']:.1f} ms primed (the prime, at start before serving: {ms['prime']:.1f} ms); "
          f"the next one {ms['next']:.1f} ms")
    print(f"first_eval_cold_ms={ms['cold_first']:.1f} first_eval_primed_ms={ms['primed_first']:.1f} "
          f"prime_ms={ms['prime']:.1f} next_eval_ms={ms['next']:.1f} "
          f"ratio={ms['primed_first'] / ms['cold_first']:.3f}")


if __name__ == "__main__":
    main()
