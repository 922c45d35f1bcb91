"""A retry of GPUs shown hung, in a short-lived worker of its own (never in the worker serving the other GPUs).

The retry worker opens only those GPUs (``only``), polls once and is killed; a GPU that still blocks is set aside
by that worker's own watch after ``stall_after``, so a retry costs a fraction of a second and a process start.
The supervisor hands the GPUs that answered back to the serving worker (``release`` on its stdin).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpuwatchd.sources.nvml import worker_process
from gpuwatchd.sources.nvml.protocol import HELLO


async def retry_worker(
    command: Sequence[str],
    opts: Mapping[str, Any],
    env: Mapping[str, str],
    hung: Mapping[int, str | None],
    *,
    start_timeout: float,
    kill_grace: float,
) -> list[int]:
    """Run ``command '<opts + only=hung>'`` once; the indices of ``hung`` it found answering with the same UUID
    (an unknown UUID matches any). Whatever goes wrong (no start, garbage, a deadline) means "not back"."""
    hang_after = float(opts["hang_after"])
    options = {**opts, "interval": 0.0, "max_polls": 1, "top_n": 0, "only": sorted(hung)}
    try:
        proc = await worker_process.spawn([*command, json.dumps(options)], env, quiet=True)
    except OSError:
        return []
    assert proc.stdout is not None
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + start_timeout
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, deadline - loop.time()))
            if not line:
                return []
            msg = json.loads(line)
            if HELLO in msg:
                deadline = loop.time() + hang_after  # init, opening the GPUs and one poll
                continue
            return [g["index"] for g in msg.get("gpus") or ()
                    if g.get("index") in hung and hung[g["index"]] in (None, g.get("uuid"))]
    except (asyncio.TimeoutError, ValueError, TypeError, AttributeError, KeyError):
        return []
    finally:
        await worker_process.terminate(proc, kill_grace)
