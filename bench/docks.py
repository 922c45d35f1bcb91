"""CPU of the Thunderbolt watch's read (``sysfs/thunderbolt.read_docks``) on an eGPU laptop's sysfs: one dock, a GPU
behind it and one inside, laid out as the kernel does (``sim/pci_tree.mirror_sysfs``).

    python bench/docks.py [--reads 300] [--apart-reads 12] [--apart 0.5] [--rounds 2] [--tree OTHER_CHECKOUT]

Each tree runs in its own child process: ``--reads`` reads back to back, then ``--apart-reads`` reads ``--apart``
seconds apart (the watch reads once a poll interval, on caches gone cold), each timed with ``time.thread_time``,
with what the watch keeps between reads (``PciScanCache``, and ``ResolvedLinks`` where the tree has it). With
``--tree`` the other checkout runs too, the two alternated ``--rounds`` times. Last line: the medians in
microseconds, best round of each (``old_`` for ``--tree``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from pci_scan import alternate  # noqa: E402

CHILD = r'''
import json, statistics, sys, tempfile, time
from pathlib import Path
from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.state import make_state
from gpuwatchd.sim.tb_tree import default_device
from gpuwatchd.sources.sysfs import thunderbolt
from gpuwatchd.sources.sysfs.pcie import PciScanCache
reads, apart_reads, apart = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
st = make_state(2)
dock = default_device("0-1")
dock.update(unique_id="uid-1", gpus=[st["devices"][1]["uuid"]])
st["thunderbolt"] = {"security": "user", "devices": [dock]}
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    mirror_sysfs(root, st)
    kw = {"pci_cache": PciScanCache()}
    if hasattr(thunderbolt, "ResolvedLinks"):
        kw["links"] = thunderbolt.ResolvedLinks()
    (d,) = thunderbolt.read_docks(root, strict=True, **kw)
    assert d.gpu_bus_ids == ("0000:0d:00.0",), d
    def timed(n, pause):
        out = []
        for _ in range(n):
            if pause:
                time.sleep(pause)
            t0 = time.thread_time()
            thunderbolt.read_docks(root, strict=True, **kw)
            out.append(time.thread_time() - t0)
        return statistics.median(out) * 1e6
    print(json.dumps({"read_us": timed(reads, 0.0), "apart_us": timed(apart_reads, apart)}))
'''


def run(tree: Path, reads: int, apart_reads: int, apart: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(reads), str(apart_reads), str(apart)], check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)},
                         cwd=tree)  # ``-c`` puts the working directory first on sys.path
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--apart-reads", type=int, default=12)
    ap.add_argument("--apart", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately")
    a = ap.parse_args()
    alternate(a.tree, a.rounds, lambda tree: run(tree, a.reads, a.apart_reads, a.apart),
              lambda res: f"{res['read_us']:.0f} us back to back, {res['apart_us']:.0f} us {a.apart:g} s apart",
              "read_us")


if __name__ == "__main__":
    main()
