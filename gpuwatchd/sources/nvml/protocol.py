"""What the NVML worker and its supervisor agree on: options, stdout lines, stderr lines, exit codes, progress word.

Both sides import this module and nothing here imports pynvml, so the daemon can read the worker's protocol
without loading NVML. The worker is ``python -m <module> '<json options>'``; :mod:`gpuwatchd.sources.nvml.worker.main`
documents the options.

- stdout: the first line is ``{"hello": <pid>}`` (written before ``nvmlInit``, so init counts towards the first
  poll's deadline), then one JSON snapshot per poll (``Snapshot`` dict form, read by ``snapshot_from_dict``).
- stderr: ``nvml_worker[<pid>] <LEVEL>: <message>`` lines (:func:`log_line`, :data:`LOG_LINE`); anything else is
  unexpected output (a traceback) and relayed as such.
- exit codes: :data:`EXIT_STOPPED`, :data:`EXIT_INIT_FAILED`, :data:`EXIT_REENUMERATE`.
- stdin: ``{"release": [index, ...]}`` lines: GPUs set aside as hung that a retry worker found answering; the
  worker polls them again (its thread blocked in the old call stays abandoned).
- progress word: 4 bytes in an inherited memfd holding the index of the GPU being called, or
  :data:`NOT_IN_A_GPU_CALL`; the supervisor reads it when the worker as a whole misses its deadline.
"""

from __future__ import annotations

import json
import re
from typing import Any

# The lost reasons the worker itself writes (model.py holds the same names for the daemon side; a test keeps them
# equal). Spelled here so that the worker, a second interpreter, does not import the model's dataclasses: ~2 MB of
# its RSS (bench/footprint.py).
HANG_SUSPECTED = "hang_suspected"
HUNG = "timeout"

__all__ = [
    "EXIT_INIT_FAILED",
    "EXIT_REENUMERATE",
    "EXIT_STOPPED",
    "HANG_SUSPECTED",
    "HELLO",
    "HUNG",
    "LOG_LINE",
    "NOT_IN_A_GPU_CALL",
    "PROGRESS_BYTES",
    "RELEASE",
    "WORKER_MODULE",
    "decode_progress",
    "encode_line",
    "encode_progress",
    "log_line",
]

WORKER_MODULE = "gpuwatchd.sources.nvml.worker.main"
HELLO = "hello"
RELEASE = "release"

EXIT_STOPPED = 0  # asked to stop (max_polls reached, parent gone)
EXIT_INIT_FAILED = 2  # after an init-failure snapshot: respawn with backoff
EXIT_REENUMERATE = 3  # a GPU was lost or the device count changed: a fresh worker re-enumerates

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LINE = re.compile(r"nvml_worker\[(\d+)\] (DEBUG|INFO|WARNING|ERROR): (.*)")

PROGRESS_BYTES = 4
NOT_IN_A_GPU_CALL = -1



def encode_line(obj: dict[str, Any]) -> str:
    """One stdout line (with its newline): compact JSON."""
    return json.dumps(obj, separators=(",", ":")) + "\n"


def log_line(pid: int, level: str, message: str) -> str:
    """One stderr line as the worker writes it (with its newline)."""
    return f"nvml_worker[{pid}] {level}: {message}\n"


def encode_progress(index: int) -> bytes:
    return index.to_bytes(PROGRESS_BYTES, "little", signed=True)


def decode_progress(raw: bytes) -> int:
    return int.from_bytes(raw[:PROGRESS_BYTES], "little", signed=True)

# nvml.h (nvmlGpmSampleGet): "The interval between two nvmlGpmSampleGet() calls should be greater than 100ms due to
# the internal sample refresh rate." The supervisor passes it as the worker's gpm_min_interval
# (sources/nvml/worker/gpm.py).
GPM_MIN_SAMPLE_INTERVAL = 0.1
