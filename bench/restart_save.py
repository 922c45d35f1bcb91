"""The first rule-history save after a restart: the file written afresh (before) or the loaded file adopted and
appended to (``HistoryFile._adopt``), at 16 GPUs x 256 processes with a full hour of history.

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
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history_save import POINTS, STEP, Fleet  # noqa: E402

from gpuwatchd.runtime.clock import ManualClock  # noqa: E402
from gpuwatchd.runtime.gc_tuning import freeze_survivors, hold_full_collections  # noqa: E402
from gpuwatchd.store import Store, persist  # noqa: E402
from gpuwatchd.store.history_file import HistoryFile  # noqa: E402


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
    hf.load()
    load = time.process_time() - c0
    if not adopt:  # as before: the first save of a run writes the file afresh
        hf._extents = None
        hf._journal.reset()
    elif hf._extents is None:
        raise SystemExit("the saved file was not adopted")
    i = POINTS + 4
    first = fleet.snapshot(i)
    hf.on_snapshot(first)
    for _ in range(12):
        store.apply(fleet.snapshot(i))
        i += 1
    clock.t = fleet.t(i - 1)
    freeze_survivors(2)
    c0 = time.process_time()
    await hf.save()
    save = time.process_time() - c0
    after = (work / persist.FILE_NAME).stat().st_size
    written = after - before if adopt else after
    if hf.save_errors:
        raise SystemExit("a save failed")
    return load, save, written


async def main_async(rounds: int) -> None:
    fleet = Fleet(16, 256)
    store = Store(step_seconds=STEP)
    store.restore_history(*fleet.history())
    freeze_survivors(2)
    hold_full_collections()
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "saved"
        saved.mkdir()
        await HistoryFile(saved, store, ManualClock(fleet.t(POINTS - 1))).save()
        got: dict[str, list[tuple[float, float, int]]] = {"afresh": [], "adopted": []}
        for _ in range(rounds):
            for mode in ("afresh", "adopted"):
                got[mode].append(await first_save(saved, Path(tmp) / mode, fleet, mode == "adopted"))
    med = {mode: [statistics.median(r[k] for r in rows) for k in range(3)] for mode, rows in got.items()}
    for mode, (load, save, written) in med.items():
        print(f"{mode}: load {load:.2f} s, first save {save:.3f} s of CPU, {written / 1e6:.2f} MB written")
    print(f"load_cpu_s={med['adopted'][0]:.3f} first_save_afresh_cpu_s={med['afresh'][1]:.3f} "
          f"first_save_adopted_cpu_s={med['adopted'][1]:.3f} written_afresh_mb={med['afresh'][2] / 1e6:.2f} "
          f"written_adopted_mb={med['adopted'][2] / 1e6:.3f} ratio={med['adopted'][1] / med['afresh'][1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main_async(args.rounds))


if __name__ == "__main__":
    main()
