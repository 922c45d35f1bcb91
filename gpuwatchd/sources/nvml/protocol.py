"""What the NVML worker and its supervisor agree on: options, stdout lines, stderr lines, exit codes, progress word.

Both sides import this module and nothing here imports pynvml, so the daemon can read the worker's protocol
without loading NVML. The worker is ``python -m <module> '<json options>'``; :mod:`gpuwatchd.sources.nvml.worker.main`
documents the options.

- stdout: the first line is ``{"hello": <pid>}`` (written before ``nvmlInit``, so init counts towards the first
  poll's deadline), then one JSON snapshot per poll (``Snapshot`` dict form, read by ``snapshot_from_dict``). With
  the option ``same_as_last`` (the daemon's supervisor sets it), a process unchanged since the last line is sent as
  its bare pid, one whose only change is its dead age as ``[pid, age]``: :class:`SameAsLast` (the daemon's end is
  ``model.SnapshotDecoder``).
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
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

# The lost reasons the worker itself writes (model.py holds the same names for the daemon side; a test keeps them
# equal). Spelled here so that the worker, a second interpreter, does not import the model's dataclasses: ~2 MB of
# its RSS (bench/footprint.py).
HANG_SUSPECTED = "hang_suspected"
HUNG = "timeout"

__all__ = [
    "AGE",
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
    "SAME_AS_LAST",
    "WORKER_MODULE",
    "SameAsLast",
    "decode_progress",
    "encode_line",
    "encode_progress",
    "log_line",
    "unique_pids",
]

WORKER_MODULE = "gpuwatchd.sources.nvml.worker.main"
HELLO = "hello"
RELEASE = "release"
SAME_AS_LAST = "same_as_last"  # the worker option: processes unchanged since the last line are sent as bare pids

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


def _pid(entry: dict[str, Any]) -> Any:
    return entry.get("pid")


def unique_pids(entries: list[T], key: Callable[[T], Any] = _pid) -> dict[Any, T]:  # type: ignore[assignment]
    """pid -> entry, for the pids listed once in one GPU's process list (``key`` gives an entry's pid). A pid
    listed twice (as a compute and a graphics process) is never sent as a bare pid: it would not say which."""
    by_pid: dict[Any, T] = {}
    twice = set()
    if key is _pid:  # the worker's dicts, 4,096 a poll at 16 x 256: without a call per entry
        by_pid = {entry.get("pid"): entry for entry in entries}  # type: ignore[attr-defined]
        if len(by_pid) == len(entries):
            return by_pid
        by_pid = {}
    for entry in entries:
        pid = key(entry)
        if pid in by_pid:
            twice.add(pid)
        by_pid[pid] = entry
    for pid in twice:
        del by_pid[pid]
    return by_pid


AGE = "host_state_seconds"  # the one process field that changes every poll of a dead process


class SameAsLast:
    """The worker's end of ``same_as_last``: in each GPU's process list, a process dict equal to the one the last
    line sent for its pid on that GPU is replaced by the bare pid, and one that differs only in its
    ``host_state_seconds`` (a dead process' age, which grows every poll) by ``[pid, seconds]``.

    At 16 GPUs x 256 processes most of a line was processes that had not changed since the last poll; encoding
    and decoding them was most of the worker's and a fifth of the daemon's CPU (issue 20). Both ends keep, per GPU
    uuid in the last line, its processes by pid (:func:`unique_pids` of the full dicts), so each line depends only
    on the one before: a fresh worker (after a restart) sends every process in full in its first line, and a line
    the daemon cannot read ends the worker. Call :meth:`encode` for the lines written, in order, and no others.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, dict[Any, Any]] = {}

    def encode(self, snap: dict[str, Any]) -> dict[str, Any]:
        """The line to write for ``snap`` (which is left as it was: changed GPU dicts are copies)."""
        last = self._last
        fresh: dict[str, dict[Any, Any]] = {}
        out_gpus = []
        changed = False
        for gpu in snap.get("gpus") or ():
            procs = gpu.get("processes")
            uuid = gpu.get("uuid")
            if not procs or not isinstance(uuid, str):
                out_gpus.append(gpu)
                continue
            by_pid = fresh[uuid] = unique_pids(procs)
            prev = last.get(uuid)
            if prev:
                out_gpus.append({**gpu, "processes": [_entry(d, prev, by_pid) for d in procs]})
                changed = True
            else:
                out_gpus.append(gpu)
        self._last = fresh
        return {**snap, "gpus": out_gpus} if changed else snap


def _entry(d: dict[str, Any], prev: dict[Any, Any], by_pid: dict[Any, Any]) -> Any:
    """What to send for process ``d``: its pid, ``[pid, age]`` or the dict itself."""
    pid = d.get("pid")
    old = prev.get(pid)
    if old is None or pid not in by_pid:
        return d
    if old == d:
        return pid
    age = d.get(AGE)
    if age is None or old.get(AGE) is None:
        return d
    d[AGE] = old[AGE]  # compared as if the age had not moved, then put back
    same = old == d
    d[AGE] = age
    return [pid, age] if same else d


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
