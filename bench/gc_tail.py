"""/metrics tail latency on a large host, with the daemon's garbage-collector tuning and without it, side by side.

    python bench/gc_tail.py [--gpus 16] [--procs 256] [--seconds 20] [--rounds 2] [--scrapers 10]

``gpuwatchd sim`` (its runner, as bench/scrape.py starts it) on the ``fleet`` scenario cut to 16 GPUs x 256
processes with ``processes.top_n: 256`` (every process exported: 4,096 per-process series per family), polling every
second; 10 closed-loop scrapers send what Prometheus sends. Rounds alternate the daemon with ``freeze_gc=True``
(what ``gpuwatchd run`` and ``gpuwatchd sim`` do: runtime/gc_tuning.py) and ``freeze_gc=False`` (the interpreter's
default collector), so other load on the machine hits both alike. The figure that the tuning is for is the maximum:
a full collection of the daemon's history is a pause of tens to hundreds of ms that every request in flight waits
out.

The daemon counts its own full collections (a ``gc.callbacks`` hook the bench adds to the launcher, one log line
per generation-2 collection with its pause): ``gen2`` is how many ran while the scrapers ran, ``gen2_max_ms`` the
longest (target: none during steady polling). ``--tree OTHER_CHECKOUT`` runs another checkout's daemon (a
before/after).

Last line: ``max_ms=… p99_ms=… max_nofreeze_ms=… p99_nofreeze_ms=… max_ratio=… gen2=… gen2_max_ms=…
gen2_nofreeze=…`` (targets: max <= 100 ms, p99 <= 10 ms, gen2 = 0; ``max_ratio`` = frozen / default, below 1 is
better).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scrape  # bench/scrape.py: the sim launcher, readiness check and closed-loop scrapers

_SIM = (
    "import gc, time, sys\n"
    "def _gen2(phase, info, started=[0.0]):\n"
    "    if info['generation'] == 2 and phase == 'start': started[0] = time.monotonic()\n"
    "    elif info['generation'] == 2: sys.stderr.write(f'gc2 {time.monotonic():.3f} "
    "{(time.monotonic() - started[0]) * 1000:.1f}\\n')\n"
    "gc.callbacks.append(_gen2)\n"
    "import asyncio, sys; from pathlib import Path; from gpuwatchd.sim.runner import run_sim; "
    "sys.exit(asyncio.run(run_sim(scenario=sys.argv[1], from_xml=None, gpus=None, speed=1.0, listen=sys.argv[3], "
    "config_path=Path(sys.argv[2]), state_dir=None, freeze_gc={freeze})))"
)


async def _round(tmp: Path, freeze: bool, seconds: float, scrapers: int) -> tuple[list[float], list[float]]:
    """Latencies of the requests, and the pauses (ms) of the full collections the daemon ran while they ran."""
    scrape._SIM = _SIM.replace("{freeze}", str(freeze))
    sim = scrape.Sim(tmp, hung=False)
    try:
        async with scrape.aiohttp.ClientSession() as session:
            await scrape._wait_for(session, sim, scrape._full, f"{scrape.GPUS} GPUs x {scrape.PROCESSES} processes")
            # long enough for the history to hold many polls: full collections come as it ages into generation 2
            await asyncio.sleep(max(scrape.WARMUP_S, 10.0))
            t0 = time.monotonic()
            lat = await scrape._load(f"{sim.url}/metrics", seconds, scrapers)
            t1 = time.monotonic()
    finally:
        sim.stop()
    pauses = []
    for line in Path(sim.log.name).read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "gc2" and t0 <= float(parts[1]) <= t1:
            pauses.append(float(parts[2]))
    return lat, pauses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scrapers", type=int, default=10)
    ap.add_argument("--tree", type=Path, help="the gpuwatchd checkout to run (default: this one)")
    a = ap.parse_args()
    if a.tree is not None:
        scrape.ROOT = a.tree.resolve()
    scrape.GPUS, scrape.PROCESSES = a.gpus, a.procs
    scrape.START_TIMEOUT_S = 180.0
    got: dict[bool, list[float]] = {True: [], False: []}
    gen2: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-gc-") as d:
        for r in range(a.rounds):
            for freeze in (True, False) if r % 2 == 0 else (False, True):
                lat, pauses = asyncio.run(_round(Path(d), freeze, a.seconds, a.scrapers))
                got[freeze] += lat
                gen2[freeze] += pauses
                print(f"round {r} freeze_gc={freeze}: {len(lat)} requests, p99 {scrape._pct(lat, 0.99):.1f} ms, "
                      f"max {max(lat) * 1000:.1f} ms, {len(pauses)} full collections "
                      f"(longest {max(pauses, default=0.0):.1f} ms)", flush=True)
    mx = {k: max(v) * 1000 for k, v in got.items()}
    p99 = {k: scrape._pct(v, 0.99) for k, v in got.items()}
    print(f"{a.gpus} GPUs x {a.procs} processes (top_n {a.procs}), {a.scrapers} scrapers, {a.rounds} rounds")
    print(f"max_ms={mx[True]:.1f} p99_ms={p99[True]:.1f} max_nofreeze_ms={mx[False]:.1f} "
          f"p99_nofreeze_ms={p99[False]:.1f} max_ratio={mx[True] / mx[False]:.2f} gen2={len(gen2[True])} "
          f"gen2_max_ms={max(gen2[True], default=0.0):.1f} gen2_nofreeze={len(gen2[False])}")


if __name__ == "__main__":
    main()
