"""CPU per save of the rule-history file at steady state: the full re-encode of every ring (version 1,
``persist.encode_rings``, what every save did before) against the incremental save (``HistoryFile.save``), in the
same run on the same rings.

    python bench/history_save.py [--rounds 60] [--old-every 10] [--quick]

Per size (16 GPUs x 256 processes with ``top_n: 256``: 4096 process rings; 8 x 32 with the default ``top_n`` of 10:
80), a real ``Store`` (default 5 s step, 1 h retention) is filled with a full hour of history (720 points a ring;
one process in 16 leaks 1 MiB a step, the others wobble, host RSS drifts), then the incremental file is written
afresh once (its first save of a run, reported apart). Each round then advances every ring by 12 points through
``Store.apply`` (one minute at the 5 s step) and saves incrementally; every ``--old-every`` rounds the full encode
is timed too (copy of the rings, encode, atomic write: the old save). Times are CPU seconds of the whole process
(``time.process_time``: the loop's read and the writer thread), so a loaded machine inflates them less than wall
time. The incremental figure is the mean over all rounds, so it includes the saves that cut off the blocks that aged
out (a copy of the file, ``cuts`` and ``cut_save_cpu_s``; the first comes ~35 rounds in).
``steady_pct_core`` is that mean per ``SAVE_INTERVAL`` (60 s) in percent of one core. The last line holds the
figures as name=value pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.model import GpuSample, ProcessSample, Snapshot  # noqa: E402
from gpuwatchd.runtime.clock import ManualClock  # noqa: E402
from gpuwatchd.runtime.gc_tuning import freeze_survivors, hold_full_collections  # noqa: E402
from gpuwatchd.store import GpuPoint, ProcessPoint, Store, persist  # noqa: E402
from gpuwatchd.store.history_file import SAVE_INTERVAL, HistoryFile  # noqa: E402
from gpuwatchd.store.journal import Delta, Journal  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_764_000_000.0
STEP = 5.0
POINTS = 720  # an hour at the 5 s step
SIZES = [("16x256", 16, 256), ("8x32", 8, 10)]  # name, GPUs, process rings per GPU (top_n)


class Fleet:
    """Synthetic GPUs and processes whose readings move like a real host's."""

    def __init__(self, gpus: int, procs: int) -> None:
        self.rnd = random.Random(20)
        self.uuids = [f"GPU-{g:08x}-5a3c-4000-8000-{g:012x}" for g in range(gpus)]
        self.pids = {u: [100_000 + g * 1000 + i for i in range(procs)] for g, u in enumerate(self.uuids)}
        self.base = {(u, p): self.rnd.randint(2, 20) * GIB for u in self.uuids for p in self.pids[u]}

    def used(self, u: str, pid: int, i: int) -> int:
        leak = (pid % 16 == 0) * i * MIB
        return self.base[(u, pid)] + leak + self.rnd.randrange(0, 8) * MIB

    def rss(self, i: int) -> int:
        return 3 * GIB + i * 4096 + self.rnd.randrange(0, 64) * 4096

    def t(self, i: int) -> float:
        return T0 + STEP * i + (i * 7919 % 1000) / 50_000  # poll times are not round

    def history(self) -> tuple[dict[str, list[GpuPoint]], dict[tuple[str, int], list[ProcessPoint]]]:
        ts = [self.t(i) for i in range(POINTS)]
        gpus = {u: [GpuPoint(t, 40 * GIB + i * MIB, 80 * GIB, 38 * GIB + i * MIB, None, None, None, None, {}, None,
                             None, None) for i, t in enumerate(ts)] for u in self.uuids}
        procs = {(u, p): [ProcessPoint(t, self.used(u, p, i), self.rss(i)) for i, t in enumerate(ts)]
                 for u in self.uuids for p in self.pids[u]}
        return gpus, procs

    def minute(self, store: Store, clock: ManualClock, i: int) -> int:
        """A minute of polls at the history step from point ``i`` (12 snapshots), the clock at the last; the next i."""
        for _ in range(12):
            store.apply(self.snapshot(i))
            i += 1
        clock.t = self.t(i - 1)
        return i

    def snapshot(self, i: int) -> Snapshot:
        gpus = []
        for g, u in enumerate(self.uuids):
            procs = tuple(ProcessSample(pid=p, used_memory_bytes=self.used(u, p, i), name="train", user="alice",
                                        host_rss_bytes=self.rss(i)) for p in self.pids[u])
            used = sum(p.used_memory_bytes or 0 for p in procs)
            gpus.append(GpuSample(uuid=u, index=g, name="NVIDIA H100", pci_bus_id=f"00000000:{g + 1:02X}:00.0",
                                  memory_total_bytes=80 * GIB, memory_used_bytes=used + 500 * MIB,
                                  processes=procs, processes_total=len(procs)))
        return Snapshot(timestamp=self.t(i), nvml_ok=True, gpus=tuple(gpus))


async def timed_save(hf: HistoryFile) -> float:
    """CPU seconds of one save (its thread included), after a young collection as the daemon's freezer leaves it."""
    freeze_survivors(2)
    c0 = time.process_time()
    await hf.save()
    return time.process_time() - c0


class TimedJournal(Journal):
    """The journal, its reads (the event loop's part of a save) timed."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: list[float] = []

    def collect(self, store: Store, *, full: bool) -> Delta:
        c = time.process_time()
        try:
            return super().collect(store, full=full)
        finally:
            self.cpu.append(time.process_time() - c)


def old_save(store: Store, path: Path, now: float) -> tuple[float, float, int]:
    """The save before the incremental one: copy every ring on the loop, encode them all, write atomically.
    Returns (CPU s, the loop's part in CPU s, bytes)."""
    c0 = time.process_time()
    rings = persist.copy_rings(store)
    c1 = time.process_time()
    data = persist.encode_rings(rings, now)
    persist.write_atomic(path, data)
    return time.process_time() - c0, c1 - c0, len(data)


async def run(name: str, gpus: int, procs: int, rounds: int, old_every: int) -> dict[str, float]:
    fleet = Fleet(gpus, procs)
    store = Store(step_seconds=STEP)
    store.restore_history(*fleet.history())
    # The daemon's collector tuning (runtime/gc_tuning.py): the history frozen, no automatic full collection (one
    # over the unfrozen objects every 30 s, here between rounds). Without it a full collection walking the ~3 M
    # points falls into some timed saves, old or new, at random.
    freeze_survivors(2)
    hold_full_collections()
    i = POINTS
    clock = ManualClock(fleet.t(i - 1))
    with tempfile.TemporaryDirectory() as tmp:
        new_dir, old_dir = Path(tmp) / "new", Path(tmp) / "old"
        new_dir.mkdir()
        old_dir.mkdir()
        hf = HistoryFile(new_dir, store, clock)
        journal = hf._journal = TimedJournal()
        c0 = time.process_time()
        await hf.save()
        first = time.process_time() - c0
        new: list[float] = []
        old: list[float] = []
        loop_old: list[float] = []
        sizes_new: list[int] = []
        cuts: list[float] = []  # the saves that cut off aged-out blocks (a copy of the file)
        old_bytes = 0
        for r in range(rounds):
            i = fleet.minute(store, clock, i)
            new.append(await timed_save(hf))
            if sizes_new and hf.saved_bytes < sizes_new[-1]:
                cuts.append(new[-1])
            sizes_new.append(hf.saved_bytes)
            if hf.save_errors:
                raise SystemExit(f"{name}: a save failed")
            if r % old_every == 0:
                cpu, loop_cpu, old_bytes = old_save(store, old_dir / persist.FILE_NAME, clock.t)
                old.append(cpu)
                loop_old.append(loop_cpu)
        # what was written loads, and holds what the store holds
        hist = persist.decode(hf.path.read_bytes())
        check = Store(step_seconds=STEP)
        persist.restore(check, hist, clock.t)
        for key in store.process_keys()[:: max(1, len(store.process_keys()) // 64)]:
            assert check.process_history(*key) == store.process_history(*key), key
    full, inc = statistics.mean(old), statistics.mean(new)
    figures = {
        f"full_save_cpu_s_{name}": full,
        f"incremental_save_cpu_s_{name}": inc,
        f"incremental_save_cpu_s_median_{name}": statistics.median(new),
        f"incremental_save_cpu_s_max_{name}": max(new),
        f"cuts_{name}": len(cuts),
        f"cut_save_cpu_s_{name}": statistics.mean(cuts) if cuts else 0.0,
        f"ratio_{name}": full / inc,
        f"first_save_cpu_s_{name}": first,
        f"loop_full_ms_{name}": 1000 * statistics.mean(loop_old),
        f"loop_incremental_ms_{name}": 1000 * statistics.mean(journal.cpu[1:]),
        f"full_file_mb_{name}": old_bytes / 1e6,
        f"incremental_file_mb_max_{name}": max(sizes_new) / 1e6,
        f"steady_pct_core_{name}": 100 * inc / SAVE_INTERVAL,
        f"full_pct_core_{name}": 100 * full / SAVE_INTERVAL,
    }
    print(f"{name}: " + " ".join(f"{k}={v:.4g}" for k, v in figures.items()), flush=True)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="incremental saves per size (one a simulated minute)")
    ap.add_argument("--old-every", type=int, default=10, help="time the full encode every N rounds")
    ap.add_argument("--quick", action="store_true", help="8 rounds, the full encode every 4")
    args = ap.parse_args()
    rounds, old_every = (8, 4) if args.quick else (args.rounds, args.old_every)
    figures: dict[str, float] = {}
    for name, gpus, procs in SIZES:
        figures.update(asyncio.run(run(name, gpus, procs, rounds, old_every)))
    short = {
        "full_save_cpu_s": figures["full_save_cpu_s_16x256"],
        "incremental_save_cpu_s": figures["incremental_save_cpu_s_16x256"],
        "ratio": figures["ratio_16x256"],
        "steady_pct_core_16x256": figures["steady_pct_core_16x256"],
        "full_pct_core_16x256": figures["full_pct_core_16x256"],
        "first_save_cpu_s_16x256": figures["first_save_cpu_s_16x256"],
        "loop_full_ms_16x256": figures["loop_full_ms_16x256"],
        "loop_incremental_ms_16x256": figures["loop_incremental_ms_16x256"],
        "cuts_16x256": figures["cuts_16x256"],
        "cut_save_cpu_s_16x256": figures["cut_save_cpu_s_16x256"],
        "incremental_file_mb_max_16x256": figures["incremental_file_mb_max_16x256"],
        "full_file_mb_16x256": figures["full_file_mb_16x256"],
        "full_save_cpu_s_8x32": figures["full_save_cpu_s_8x32"],
        "incremental_save_cpu_s_8x32": figures["incremental_save_cpu_s_8x32"],
        "ratio_8x32": figures["ratio_8x32"],
        "steady_pct_core_8x32": figures["steady_pct_core_8x32"],
    }
    print(" ".join(f"{k}={v:.4g}" for k, v in short.items()))


if __name__ == "__main__":
    main()
