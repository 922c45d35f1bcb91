"""CPU of reading one worker line with a timeout: ``asyncio.wait_for(reader.readline(), t)`` (what the supervisor
did) against ``runtime/waits.within(t, reader.readline)`` (what it does), in-process.

    python bench/line_read.py [--lines 3000] [--rounds 3]

A real pipe read through asyncio's ``StreamReader`` as the supervisor reads the worker's stdout; a second task
writes one ~6 kB line (an 8x32 snapshot's size) each time the reader asks for one, so every read waits for data as
the supervisor's does. CPU of this thread (``time.thread_time``) per line, both ways alternated ``--rounds`` times;
the last line holds the best round of each in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuwatchd.runtime.waits import within

LINE = b"x" * 6000 + b"\n"


async def measure(lines: int, use_within: bool) -> float:
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    reader = asyncio.StreamReader(limit=1 << 20)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(r, "rb"))
    try:
        t0 = time.thread_time()
        for _ in range(lines):
            loop.call_soon(os.write, w, LINE)
            if use_within:
                line = await within(5.0, reader.readline)
            else:
                line = await asyncio.wait_for(reader.readline(), 5.0)
            assert line == LINE
        return (time.thread_time() - t0) / lines * 1e6
    finally:
        transport.close()
        os.close(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    best: dict[str, float] = {}
    for r in range(a.rounds):
        for name, use in (("wait_for_us", False), ("within_us", True)):
            us = asyncio.run(measure(a.lines, use))
            print(f"round {r + 1} {name}: {us:.1f} us a line")
            best[name] = min(best.get(name, us), us)
    print(" ".join(f"{k}={v:.1f}" for k, v in best.items()))


if __name__ == "__main__":
    main()
