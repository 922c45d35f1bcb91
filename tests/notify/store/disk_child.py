"""Child process for the full-disk tests: a dispatcher whose state dir is on a tiny file system, driven over stdin.

Usage: python disk_child.py STATE_DIR SINK_URL. Prints "ready"; then per stdin line: ``alerts N`` makes GPUs 0..N-1
fire (each its own group, so one notification each; re-reported every 100 ms like the rules do), ``stats`` prints
one JSON line of the state database's writer stats and the queue depth. Runs until killed or stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from gpuwatchd.model import Alert
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import RealClock
from tests.notify.durability_child import child_config

FIRED_AT = 1_700_000_000.0
BULK = "x" * 3000  # a few KiB per notification, so a 1 MiB file system fills in a few dozen


def alerts(n: int) -> list[Alert]:
    return [
        Alert(
            name="GpuXidError",
            severity="critical",
            labels={"alertname": "GpuXidError", "severity": "critical", "uuid": f"GPU-{i:03d}", "gpu": str(i)},
            summary=f"Xid 79 on GPU {i}",
            description=f"fallen off the bus {BULK}",
            state="firing",
            active_at=FIRED_AT,
            fired_at=FIRED_AT,
        )
        for i in range(n)
    ]


async def main(state_dir: Path, url: str) -> None:
    d = Dispatcher(child_config(url), state_dir=state_dir, clock=RealClock(), host="h")
    await d.start()
    print("ready", flush=True)
    current: list[Alert] = []

    async def feed() -> None:
        while True:
            d.update(current)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(feed())
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd, *args = line.split()
        if cmd == "alerts":
            current = alerts(int(args[0]))
            d.update(current)
            print("ok", flush=True)
        elif cmd == "stats":
            s = d.state.writer.stats
            out = {
                "held": s.held,
                "unpersisted": s.held_notifications,
                "writable": s.writable,
                "failures": sum(s.failures.values()),
                "depth": sum(d.outbox.depths().values()),
                # every write submitted so far was tried (committed, or held and counted above): without it "held
                # 0" may only mean "not tried yet" (the writes are still in the thread's queue)
                "settled": d.state.writer.settled(),
            }
            print(json.dumps(out), flush=True)
    task.cancel()
    await d.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
