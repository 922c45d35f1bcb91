"""Kernel-log flood: how fast the reader takes records in, and how long the event loop waits for it meanwhile.

    python bench/kmsg_flood.py [--records 100000] [--line-mb 31]

Real parts: the reader (``KmsgReader`` following a regular file, as for ``gpuwatchd sim --kernel-log``), the parser,
the ingest and the Store, on one event loop. The file holds one ``--line-mb`` MB record (cut to 16 KiB) and then
``--records`` Xid records for one address. A ticker task sleeps 10 ms at a time and records the longest it was kept
waiting beyond that: what ``/healthz`` would have waited.

Last line: ``records_per_second=… max_loop_stall_ms=… seconds=… rss_growth_mb=…`` (targets: max_loop_stall_ms
under 100 on an idle core; it was 13000 for the 31 MB line and ~1400 for 100k records before issue 21).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.runtime.clock import ScaledClock  # noqa: E402
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest  # noqa: E402
from gpuwatchd.sources.kmsg.reader import KmsgReader  # noqa: E402
from gpuwatchd.store import Store  # noqa: E402

TICK = 0.01


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(records: int, line_mb: int, path: Path) -> tuple[float, float, float]:
    store = Store()
    ingest = KernelLogIngest(store)
    reader = KmsgReader(path, ingest, clock=ScaledClock(), state_file=None)
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        while True:
            t = time.perf_counter()
            await asyncio.sleep(TICK)
            worst = max(worst, time.perf_counter() - t - TICK)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    task = asyncio.create_task(reader.run())
    want = records + 1
    while ingest.stats.lines["xid"] < want:
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    for t in (task, tick):
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    return elapsed, worst, float(ingest.stats.records_cut)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--line-mb", type=int, default=31)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kmsg"
        with path.open("wb") as f:
            f.write(b"4,1,1000,-;NVRM: Xid (PCI:0000:06:00): 13, " + b"x" * (args.line_mb << 20) + b"\n")
            f.writelines(b"4,%d,%d,-;NVRM: Xid (PCI:0000:06:00): 13, pid=7, name=storm, Ch %d\n" % (i, i * 1000, i)
                         for i in range(2, args.records + 2))
        rss = _rss_mb()
        elapsed, worst, cut = asyncio.run(run(args.records, args.line_mb, path))
        growth = _rss_mb() - rss
    assert cut == 1, cut
    print(f"records={args.records} line_mb={args.line_mb}")
    print(f"records_per_second={args.records / elapsed:.0f} max_loop_stall_ms={worst * 1000:.1f} "
          f"seconds={elapsed:.2f} rss_growth_mb={growth:.1f}")


if __name__ == "__main__":
    main()
