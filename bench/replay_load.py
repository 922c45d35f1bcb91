"""What loading the sim's inputs costs at their limits: time and peak memory of each load in a process of its own.

    python bench/replay_load.py

Real parts: ``gpuwatchd.sim.csv_replay.load_csv_scenario`` (parse, resample into series steps, scenario validation)
and ``gpuwatchd.sim.kmsg_replay.load_kernel_log`` (the pasted-log parser), each run in a fresh interpreter whose
``ru_maxrss`` is its own peak. Inputs, generated in a temp dir:

- ``csv_day``: one GPU, a reading every second for a day (86,400 rows, 4 series);
- ``csv_sparse``: 64 GPUs read twice, 11 days apart (10 KB): the gap was filled with a value per second, 3 GiB and
  minutes before issue 21, now two runs of readings per series;
- ``kmsg_continuation``: one Xid and 4,000,000 indented continuation lines (12 MB): quadratic before (minutes);
- ``kmsg_lines``: 200,000 Xid lines (18 MB).

Last line: ``csv_day_s=… csv_day_mb=… csv_sparse_s=… csv_sparse_mb=… kmsg_continuation_s=… kmsg_continuation_mb=…
kmsg_lines_s=… kmsg_lines_mb=…`` (targets on an idle core: each under 15 s and 600 MB).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import resource, sys, time
from pathlib import Path
kind, path = sys.argv[1], Path(sys.argv[2])
t = time.perf_counter()
if kind == "csv":
    from gpuwatchd.sim.csv_replay import load_csv_scenario
    load_csv_scenario(path)
else:
    from gpuwatchd.sim.kmsg_replay import load_kernel_log
    load_kernel_log(path)
print(f"{time.perf_counter() - t:.2f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
"""

HEADER = ("timestamp, index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], temperature.gpu, "
          "power.draw [W]\n")


def _csv(path: Path, gpus: int, times: list[int]) -> None:
    t0 = datetime.datetime(2025, 5, 20)
    with path.open("w") as f:
        f.write(HEADER)
        for s in times:
            ts = (t0 + datetime.timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.000")
            for g in range(gpus):
                f.write(f"{ts}, {g}, NVIDIA A10G, {1000 + s % 500} MiB, 23028 MiB, {s % 100} %, 40, 60.5 W\n")


def main() -> None:
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-bench-replay-") as tmp:
        d = Path(tmp)
        _csv(d / "day.csv", 1, list(range(86_400)))
        _csv(d / "sparse.csv", 64, [0, 11 * 86_400])
        xid = "[    1.000000] NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=python, Graphics Exception\n"
        (d / "cont.log").write_text(xid + " x\n" * 4_000_000)
        (d / "lines.log").write_text("".join(
            f"[{i}.000000] NVRM: Xid (PCI:0000:01:00): 13, pid={i}, name=python, Graphics Exception\n"
            for i in range(200_000)))  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name, kind, file in (("csv_day", "csv", "day.csv"), ("csv_sparse", "csv", "sparse.csv"),
                                 ("kmsg_continuation", "kmsg", "cont.log"), ("kmsg_lines", "kmsg", "lines.log")):
            out = subprocess.run([sys.executable, "-c", CHILD, kind, str(d / file)], capture_output=True, text=True,
                                 env=env, check=True, timeout=600).stdout.split()  # fmt: skip
            figures[f"{name}_s"], figures[f"{name}_mb"] = out[0], out[1]
            print(f"{name}: {out[0]} s, {out[1]} MB peak", flush=True)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
