"""Scenario per-process utilization -> the stand-in's per-process utilization samples.

A scenario gives a process ``sm_util`` / ``memory_util`` / ``encoder_util`` / ``decoder_util`` (percent, like
``nvidia-smi pmon``); the stand-in serves NVML's raw form, a list of timestamped samples per device
(``process_utilization`` in docs/sim-state.md). Each state the player writes is one driver sample period ending at
the state's clock: a sample per process with non-zero utilization (nvml.h returns no sample for an idle process).
A device none of whose processes has these fields keeps answering NOT_SUPPORTED, as before. The player writes a
state at most every 0.1 wall seconds (sim/player.py MIN_WALL_TICK_S): a sim fast enough that polls come more often
than that sees polls with no new sample, which read 0, as a real driver polled faster than its sample period does.
"""

from __future__ import annotations

from typing import Any

# scenario process field -> sample key (gpuwatchd/sim/state.py PROCESS_UTILIZATION_KEYS)
PROCESS_UTIL_FIELDS = {"sm_util": "sm", "memory_util": "memory", "encoder_util": "encoder",
                       "decoder_util": "decoder"}


def derive_process_utilization(dev: dict[str, Any], clock: float) -> None:
    """Move the processes' utilization fields of ``dev`` into its ``process_utilization`` samples, in place."""
    samples: list[dict[str, Any]] | None = None
    stamp = max(1, int(clock * 1e6))
    for kind in ("compute", "graphics"):
        for proc in (dev.get("processes") or {}).get(kind) or ():
            values = {key: proc.pop(field) for field, key in PROCESS_UTIL_FIELDS.items() if field in proc}
            if not values:
                continue
            if samples is None:
                samples = []
            pct = {k: max(0, min(100, round(v or 0))) for k, v in values.items()}
            if any(pct.values()):
                samples.append({"pid": proc["pid"], "timestamp_us": stamp, **pct})
    if samples is not None:
        dev["process_utilization"] = samples
