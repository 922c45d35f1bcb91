"""/metrics tail latency on a large host, with the daemon's garbage-collector tuning and without it, side by side.

    python bench/gc_tail.py [--gpus 16] [--procs 256] [--seconds 20] [--rounds 2] [--scrapers 10] [--tree DIR]
                            [--frozen-only] [--blocks MS] [--player-apart] [--dead]

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

``--blocks MS`` loads ``bench/loop_blocks.py`` into the daemon and prints, per round, how long every event-loop
callback of at least MS ms ran (wall, and the loop thread's CPU) and every per-poll step (decoding, ``Store.apply``,
attribution, the rules, collecting, gzip...): what a scrape arriving at that moment waits for, less sensitive to
the machine's load than the latencies. ``--player-apart`` runs the sim's scenario player in a child process (under
``gpuwatchd sim`` it is a thread of the daemon holding the GIL ~30 ms twice a second at 16 x 256, which the daemon
under ``gpuwatchd run`` does not have); ``--dead`` runs the production NVML worker, so every (fictitious) process is
gone and GpuMemoryHeldByDeadProcess fires for each, as under ``bench/footprint.py``.

Last line: ``max_ms=… p99_ms=… max_nofreeze_ms=… p99_nofreeze_ms=… max_ratio=… gen2=… gen2_max_ms=…
gen2_nofreeze=…`` (targets: max <= 100 ms, p99 <= 10 ms, gen2 = 0; ``max_ratio`` = frozen / default, below 1 is
better).
"""

from __future__ import annotations

import argparse
import asyncio
import math
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
    "{blocks}"
    "{dead}"
    "{apart}"
    "import asyncio, sys; from pathlib import Path; from gpuwatchd.sim.runner import run_sim; "
    "sys.exit(asyncio.run(run_sim(scenario=sys.argv[1], from_xml=None, gpus=None, speed=1.0, listen=sys.argv[3], "
    "config_path=Path(sys.argv[2]), state_dir=None, freeze_gc={freeze})))"
)


# --blocks: bench/loop_blocks.py loaded into the daemon (whatever tree it runs) before it starts.
_BLOCKS = (
    f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import loop_blocks; "
    "loop_blocks.BLOCK_MS = {block_ms}; loop_blocks.install()\n"
)
# --dead: the production NVML worker (psutil on the host's /proc) instead of the sim's: the stand-in's pids are
# fictitious, so every process is gone and GpuMemoryHeldByDeadProcess fires for each, as under bench/footprint.py.
_DEAD = (
    "import gpuwatchd.sim.runner as _r; from gpuwatchd.sources.nvml.protocol import WORKER_MODULE as _W; "
    "_r.SIM_WORKER_MODULE = _W\n"
)
# --player-apart: the scenario player steps in a forked child instead of a thread of the daemon. At 16 x 256 a step
# (the state of 4,096 processes built, compared and written) is ~30 ms of CPU twice a second, holding the daemon's
# GIL: the event loop then waits for it (up to the 5 ms switch interval at every hand-over), which a daemon under
# `gpuwatchd run` (the driver in the kernel) never does. The child leaves the daemon's signal wake-up fd and
# collector hooks alone and ends with it.
_APART = (
    "import os as _os, signal as _sg, time as _tm, gc as _gc, gpuwatchd.sim.player as _pl\n"
    "async def _run_apart(self):\n"
    "    tick = max(self.tick, _pl.MIN_WALL_TICK_S * self.clock.speed) / self.clock.speed\n"
    "    parent = _os.getpid()\n"
    "    child = _os.fork()\n"
    "    if child == 0:\n"
    "        try:\n"
    "            _sg.set_wakeup_fd(-1); _sg.signal(_sg.SIGTERM, _sg.SIG_DFL); _sg.signal(_sg.SIGINT, _sg.SIG_DFL)\n"
    "            _gc.callbacks.clear(); sys.stderr = open(_os.devnull, 'w')\n"
    "            while _os.getppid() == parent:\n"
    "                self.step(); _tm.sleep(tick)\n"
    "        finally:\n"
    "            _os._exit(0)\n"
    "    try:\n"
    "        await asyncio.Event().wait()\n"
    "    finally:\n"
    "        _os.kill(child, _sg.SIGKILL); _os.waitpid(child, 0)\n"
    "_pl.Player.run = _run_apart\n"
)
OPTIONS: dict[str, float | bool] = {"blocks": 0.0, "dead": False, "apart": False}


def _steps(log: str, t0: float, t1: float) -> dict[str, list[float]]:
    """loop_blocks lines in [t0, t1]: durations (ms) per step, per collection generation, and of the loop blocks
    (``blk``: all, and ``blk:<what>`` per callback; ``blk.cpu``: the loop thread's CPU time in them)."""
    out: dict[str, list[float]] = {}
    for line in log.splitlines():
        parts = line.split(maxsplit=3)
        try:
            if parts[0] == "tm" and t0 <= float(parts[1]) <= t1:
                step, wall, *cpu = line.split()[2:]
                out.setdefault(step, []).append(float(wall))
                if cpu:
                    out.setdefault(f"{step}.cpu", []).append(float(cpu[0]))
            elif parts[0] in ("collect0", "collect1", "collect2") and t0 <= float(parts[1]) <= t1:
                gen, _, ms, *found = line.split()
                out.setdefault(gen, []).append(float(ms))
                if found:
                    out.setdefault(f"{gen}.found", []).append(float(found[0]))
            elif parts[0] == "blk" and t0 <= float(parts[1]) <= t1:
                wall, cpu, what = line.split(maxsplit=4)[2:]
                out.setdefault("blk", []).append(float(wall))
                out.setdefault("blk.cpu", []).append(float(cpu))
                out.setdefault(f"blk:{what}", []).append(float(wall))
                out.setdefault(f"blk.cpu:{what}", []).append(float(cpu))
        except (IndexError, ValueError):
            continue
    return out


def _step_table(steps: dict[str, list[float]], seconds: float) -> str:
    rows = []
    for name in sorted(steps, key=lambda k: (k.startswith(("blk:", "blk.cpu:")), k.replace(".cpu", ""), ".cpu" in k)):
        v = sorted(steps[name])
        rows.append(f"  {name:<48} n={len(v):>6} ({len(v) / seconds:7.1f}/s) p50 {v[len(v) // 2]:7.2f} "
                    f"p99 {v[min(len(v) - 1, round(0.99 * (len(v) - 1)))]:7.2f} max {v[-1]:7.2f} ms"
                    f"  >=10ms: {sum(x >= 10 for x in v)}")
    return "\n".join(rows)


async def _round(tmp: Path, freeze: bool, seconds: float, scrapers: int) -> tuple[list[float], list[float]]:
    """Latencies of the requests, and the pauses (ms) of the full collections the daemon ran while they ran."""
    scrape._SIM = _SIM.replace("{freeze}", str(freeze)).replace(
        "{blocks}", _BLOCKS.replace("{block_ms}", str(OPTIONS["blocks"])) if OPTIONS["blocks"] else "").replace(
        "{dead}", _DEAD if OPTIONS["dead"] else "").replace("{apart}", _APART if OPTIONS["apart"] else "")
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
    log = Path(sim.log.name).read_text(errors="replace")
    if OPTIONS["blocks"]:
        print(f"freeze_gc={freeze}: event-loop blocks >= {OPTIONS['blocks']} ms and per-step durations while "
              f"scraped\n{_step_table(_steps(log, t0, t1), t1 - t0)}", flush=True)
    for line in log.splitlines():
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
    ap.add_argument("--blocks", type=float, default=0.0, metavar="MS",
                    help="print how long each per-poll step and every event-loop callback of at least MS ms took "
                         "while scraped (bench/loop_blocks.py; adds its own small overhead)")
    ap.add_argument("--dead", action="store_true",
                    help="every process gone (the production worker over fictitious pids, as bench/footprint.py)")
    ap.add_argument("--frozen-only", action="store_true", help="skip the rounds with the default collector")
    ap.add_argument("--player-apart", action="store_true",
                    help="the sim's scenario player in a child process, not a thread holding the daemon's GIL")
    a = ap.parse_args()
    OPTIONS["blocks"], OPTIONS["dead"], OPTIONS["apart"] = a.blocks, a.dead, a.player_apart
    if a.tree is not None:
        scrape.ROOT = a.tree.resolve()
    scrape.GPUS, scrape.PROCESSES = a.gpus, a.procs
    scrape.START_TIMEOUT_S = 180.0
    got: dict[bool, list[float]] = {True: [], False: []}
    gen2: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-gc-") as d:
        for r in range(a.rounds):
            for freeze in (True,) if a.frozen_only else (True, False) if r % 2 == 0 else (False, True):
                lat, pauses = asyncio.run(_round(Path(d), freeze, a.seconds, a.scrapers))
                got[freeze] += lat
                gen2[freeze] += pauses
                print(f"round {r} freeze_gc={freeze}: {len(lat)} requests, p99 {scrape._pct(lat, 0.99):.1f} ms, "
                      f"max {max(lat) * 1000:.1f} ms, {len(pauses)} full collections "
                      f"(longest {max(pauses, default=0.0):.1f} ms)", flush=True)
    mx = {k: max(v, default=math.nan) * 1000 for k, v in got.items()}
    p99 = {k: scrape._pct(v, 0.99) for k, v in got.items()}
    print(f"{a.gpus} GPUs x {a.procs} processes (top_n {a.procs}), {a.scrapers} scrapers, {a.rounds} rounds")
    print(f"max_ms={mx[True]:.1f} p99_ms={p99[True]:.1f} max_nofreeze_ms={mx[False]:.1f} "
          f"p99_nofreeze_ms={p99[False]:.1f} max_ratio={mx[True] / mx[False]:.2f} gen2={len(gen2[True])} "
          f"gen2_max_ms={max(gen2[True], default=0.0):.1f} gen2_nofreeze={len(gen2[False])}")


if __name__ == "__main__":
    main()
