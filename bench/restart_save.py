"""A restart with a full hour of rule history at 16 GPUs x 256 processes: the load, and the first save after it,
as before (the collector running through the load; the first save writing the file afresh) and as the daemon does
now (the load under ``gc_tuning.paused(freeze=True)``; the loaded file adopted and appended to,
``HistoryFile._adopt``).

    python bench/restart_save.py [--rounds 3]

A store with an hour of synthetic history (``bench/history_save.py``'s fleet: one process in 16 leaking, the
others wobbling) is saved; then, per round and per mode, a restarted store loads the file, takes a minute of polls
(12 snapshots at the 5 s step) and saves. CPU time of the whole process (``time.process_time``: the save's thread
included) for the load and for that first save, and the bytes the save wrote. The last line: medians, and the
first save's CPU ratio adopted / afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history_save import POINTS, STEP, Fleet, timed_save  # noqa: E402

from gpuwatchd.runtime.clock import ManualClock  # noqa: E402
from gpuwatchd.runtime.gc_tuning import freeze_survivors, hold_full_collections, paused  # noqa: E402
from gpuwatchd.store import Store, persist  # noqa: E402
from gpuwatchd.store.history_file import HistoryFile  # noqa: E402


def fresh_start(thresholds: tuple[int, int, int]) -> None:
    """The collector as a daemon has it when it loads the history at start: nothing frozen, the default
    thresholds (``keep_frozen``, which holds full collections, starts after the load)."""
    gc.unfreeze()
    gc.collect()
    gc.set_threshold(*thresholds)


async def first_save(saved: Path, work: Path, fleet: Fleet, adopt: bool) -> tuple[float, float, int]:
    """(load CPU s, first save CPU s, bytes written by the first save) for one restart."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    shutil.copy(saved / persist.FILE_NAME, work / persist.FILE_NAME)
    before = (work / persist.FILE_NAME).stat().st_size
    clock = ManualClock(fleet.t(POINTS - 1) + 20.0)
    store = Store(step_seconds=STEP)
    hf = HistoryFile(work, store, clock)
    c0 = time.process_time()
    if adopt:
        with paused(freeze=True):  # as Daemon.start loads it
            hf.load()
    else:
        hf.load()
    load = time.process_time() - c0
    if not adopt:  # as before: the first save of a run writes the file afresh
        hf._extents = None
        hf._journal.reset()
    elif hf._extents is None:
        raise SystemExit("the saved file was not adopted")
    hold_full_collections()  # from here on as the running daemon
    i = POINTS + 4
    first = fleet.snapshot(i)
    hf.on_snapshot(first)
    fleet.minute(store, clock, i)
    save = await timed_save(hf)
    after = (work / persist.FILE_NAME).stat().st_size
    written = after - before if adopt else after
    if hf.save_errors:
        raise SystemExit("a save failed")
    return load, save, written


async def main_async(rounds: int) -> None:
    fleet = Fleet(16, 256)
    defaults = gc.get_threshold()
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "saved"
        saved.mkdir()
        store = Store(step_seconds=STEP)
        store.restore_history(*fleet.history())
        freeze_survivors(2)
        hold_full_collections()
        await HistoryFile(saved, store, ManualClock(fleet.t(POINTS - 1))).save()
        del store
        fresh_start(defaults)
        got: dict[str, list[tuple[float, float, int]]] = {"afresh": [], "adopted": []}
        for _ in range(rounds):
            for mode in ("afresh", "adopted"):
                got[mode].append(await first_save(saved, Path(tmp) / mode, fleet, mode == "adopted"))
                fresh_start(defaults)
    med = {mode: [statistics.median(r[k] for r in rows) for k in range(3)] for mode, rows in got.items()}
    for mode, (load, save, written) in med.items():
        label = "before" if mode == "afresh" else "after"
        print(f"{label}: load {load:.2f} s, first save {save:.3f} s of CPU, {written / 1e6:.2f} MB written")
    print(f"load_before_cpu_s={med['afresh'][0]:.3f} load_after_cpu_s={med['adopted'][0]:.3f} "
          f"first_save_afresh_cpu_s={med['afresh'][1]:.3f} "
          f"first_save_adopted_cpu_s={med['adopted'][1]:.3f} written_afresh_mb={med['afresh'][2] / 1e6:.2f} "
          f"written_adopted_mb={med['adopted'][2] / 1e6:.3f} ratio={med['adopted'][1] / med['afresh'][1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main_async(args.rounds))


if __name__ == "__main__":
    main()
