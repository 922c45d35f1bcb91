"""What a once-a-second wake-up costs by itself: asyncio tasks that sleep a second and do nothing, woken apart or
in the same loop iteration, and threads woken by an event.

    python bench/wakeups.py [--seconds 30] [--tasks 4]

Each case runs in its own interpreter at the same time as the others (so the machine's load hits them alike), and
measures its own CPU time (``time.process_time``) over ``--seconds`` after 3 s:

- ``idle``: an event loop with nothing to do (its only timer is the measurement's own);
- ``one``: one task in ``while True: await asyncio.sleep(1)``;
- ``spread``: ``--tasks`` such tasks, their wake-ups 0.1 s apart (each in a loop iteration of its own, as the
  daemon's 1 Hz watches were);
- ``aligned``: ``--tasks`` such tasks woken in the same loop iteration (as the watches are on runtime/beat.py);
- ``thread_one`` / ``thread_two``: a thread that wakes a second (a poller doing ~0.5 ms of work) and sets an event
  another thread waits on, which then waits once (``one``) or twice (``two``, the NVML worker's stall watch: at the
  poll's start, then a check period later).

This is what runtime/beat.py rests on: on this project's 2-core VM a lone 1 Hz wake-up cost ~0.25-0.29 ms of CPU a
second with nothing to do, and tasks woken together shared that (docs/performance.md, "8x32"). Last line:
``<case>_ms_per_s=…`` for each case.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r'''
import asyncio, sys, threading, time
case, seconds, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])

def work():
    x = 0
    for i in range(20000):
        x += i

def threads(two):
    act, done = threading.Event(), threading.Event()
    def poller():
        while not done.is_set():
            act.set()
            work()
            time.sleep(1)
    def watcher():
        while not done.is_set():
            act.clear()
            act.wait()
            if two:
                done.wait(0.0625)
    threading.Thread(target=poller, daemon=True).start()
    threading.Thread(target=watcher, daemon=True).start()
    time.sleep(3)
    t = time.process_time()
    time.sleep(seconds)
    return time.process_time() - t

async def sleeper(offset):
    await asyncio.sleep(offset)
    while True:
        await asyncio.sleep(1)

async def tasks(count, apart):
    for i in range(count):
        asyncio.create_task(sleeper(i * apart))
    await asyncio.sleep(3)
    t = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - t

if case.startswith("thread_"):
    cpu = threads(case == "thread_two")
else:
    count, apart = {"idle": (0, 0.0), "one": (1, 0.0), "spread": (n, 0.1), "aligned": (n, 0.0)}[case]
    cpu = asyncio.run(tasks(count, apart))
print(cpu / seconds * 1000)
'''
CASES = ("idle", "one", "spread", "aligned", "thread_one", "thread_two")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--tasks", type=int, default=4)
    args = ap.parse_args()
    procs = {case: subprocess.Popen([sys.executable, "-c", CHILD, case, str(args.seconds), str(args.tasks)],
                                    stdout=subprocess.PIPE, text=True) for case in CASES}
    out = {}
    for case, p in procs.items():
        stdout, _ = p.communicate()
        out[case] = float(stdout.strip())
        print(f"{case:11s} {out[case]:.3f} ms of CPU a second", flush=True)
    print(" ".join(f"{case}_ms_per_s={v:.3f}" for case, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
