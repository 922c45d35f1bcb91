"""Child process for the replayed scenario tests: the real NVML worker's ``Worker`` class, polled on command.

``python nvml_child.py`` with ``LD_LIBRARY_PATH`` at the stand-in (as the supervisor sets it). The worker's own main
loop polls on a timer; here the test says when, so each poll sees exactly the state the test wrote before it.
Commands, one JSON object per stdin line, each answered by one JSON line on stdout:
``{"op": "start", "state": PATH, "top_n": N}`` (fresh NVML session, as a respawned worker), ``{"op": "poll"}``
(the worker's snapshot line plus ``"reenumerate"``: why the real worker would now exit), ``{"op": "close"}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuwatchd.sim.resolver import SimResolver
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sources.nvml.worker.session import Worker


def main() -> int:
    worker: Worker | None = None
    for line in sys.stdin:
        cmd: dict[str, Any] = json.loads(line)
        out: dict[str, Any] = {"ok": True}
        op = cmd["op"]
        if op == "start":
            if worker is not None:
                worker.close()
            os.environ[STATE_ENV] = cmd["state"]  # read by nvmlInit, as in a freshly spawned worker
            worker = Worker(int(cmd.get("top_n", 10)), SimResolver(Path(cmd["state"])))
            worker.start()
        elif op == "poll":
            assert worker is not None, "poll before start"
            out = worker.poll()
            out["reenumerate"] = worker.reenumerate
        elif op == "close":
            if worker is not None:
                worker.close()
            worker = None
        else:
            out = {"ok": False, "error": f"unknown op {op!r}"}
        sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
