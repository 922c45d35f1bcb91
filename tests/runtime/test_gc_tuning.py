"""runtime/gc_tuning.py in a fresh interpreter (it changes process-wide collector state): automatic full collections
are held, the periodic full collection finds the cycles made since the last freeze before freezing the survivors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, gc, weakref
from gpuwatchd.runtime import gc_tuning

class Node:
    pass

gc_tuning.freeze_survivors()
kept = [Node() for _ in range(1000)]  # survivors: frozen by the next freeze
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle that becomes garbage
gone = weakref.ref(a)
for _ in range(3):
    gc.collect(1)  # aged into the oldest generation, where only a full collection looks
del a, b
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)

async def main():
    task = asyncio.create_task(gc_tuning.keep_frozen(interval=0.2))
    await asyncio.sleep(0)
    assert gc.get_threshold()[2] == gc_tuning.HELD_THRESHOLD
    junk = []
    for i in range(300_000):  # many young collections: none of them may become an automatic full one
        junk.append([i])
        if len(junk) > 1000:
            junk.clear()
    assert full == [], full
    before = gc.get_freeze_count()
    await asyncio.sleep(0.5)
    task.cancel()
    assert full, "keep_frozen ran no full collection"
    assert gone() is None, "the cycle was frozen instead of collected"
    assert gc.get_freeze_count() >= before + len(kept) - 10
asyncio.run(main())
print("ok")
"""


def test_full_collections_are_held_and_run_by_keep_frozen() -> None:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


PAUSED = r"""
import gc
from gpuwatchd.runtime import gc_tuning

runs = []
gc.callbacks.append(lambda phase, info: runs.append(info["generation"]) if phase == "stop" else None)
gc.collect()
runs.clear()
with gc_tuning.paused():
    loaded = [[i, float(i), None] for i in range(200_000)]  # a bulk load: no collection walks it
    assert not gc.isenabled()
    during = list(runs)
assert during == [], during
assert gc.isenabled()  # as it was
frozen = gc.get_freeze_count()
runs.clear()
with gc_tuning.paused(freeze=True):
    before = list(runs)  # a young collection first, so young garbage is not frozen for good
    more = [[i] for i in range(100_000)]
    during = runs[len(before):]
assert before == [1], before
assert gc.get_freeze_count() >= frozen + len(more) and during == [] and gc.isenabled()
gc.disable()
with gc_tuning.paused():
    pass
assert not gc.isenabled()  # a collector that was off stays off
print("ok")
"""


def test_paused_runs_no_collection_and_restores_the_collector() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PAUSED], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
