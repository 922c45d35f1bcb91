"""``gpuwatchd sim --resume``: a simulation restarted with the same ``--state-dir`` goes on where it stopped.

A daemon restarted in the middle of a job (upgrade, crash) is what the rule-history persistence is for; to test
it end to end, the scenario must not start over when the daemon does. The sim saves its scenario clock (the
scenario's start on the daemon's clock, the clock's reading and the wall time of that reading) to
``<state_dir>/sim-clock.json`` every second; ``--resume`` reads it and starts the daemon's scaled clock where it
would be had it kept running, with the scenario's start unchanged.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuwatchd.runtime.clock import ScaledClock

FILE_NAME = "sim-clock.json"


@dataclass(frozen=True)
class SimClock:
    start: float  # the scenario's t=0 on the daemon's clock
    now: float  # the daemon's clock when saved
    wall: float  # time.time() when saved

    def now_for(self, speed: float) -> float:
        """The daemon's clock now, had it kept running at ``speed``."""
        return self.now + max(0.0, time.time() - self.wall) * speed


def save_sim_clock(state_dir: Path, start: float, clock: ScaledClock) -> None:
    path = state_dir / FILE_NAME
    tmp = path.with_name(FILE_NAME + ".tmp")
    tmp.write_text(json.dumps({"start": start, "now": clock.now(), "wall": time.time()}))
    os.replace(tmp, path)


def load_sim_clock(state_dir: Path) -> SimClock | None:
    """The saved clock, or None (first run, or a file that is not one: start the scenario afresh)."""
    from gpuwatchd.config.files import InputFileError, read_text_file

    try:
        # through the capped, non-blocking reader: the state dir is the user's, a FIFO or /dev/zero may sit there
        doc = json.loads(read_text_file(state_dir / FILE_NAME, max_bytes=MAX_CLOCK_FILE_BYTES))
        values = [float(doc[k]) for k in ("start", "now", "wall")]
    except (InputFileError, ValueError, KeyError, TypeError, RecursionError, OverflowError):
        return None
    if not all(math.isfinite(v) and abs(v) <= MAX_CLOCK_SECONDS for v in values):
        return None  # a clock the player's arithmetic cannot use: the scenario starts afresh
    return SimClock(*values)


MAX_CLOCK_FILE_BYTES = 4096  # three numbers
MAX_CLOCK_SECONDS = 1e11  # unix seconds, beyond the year 5000
