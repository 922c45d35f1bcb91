"""Run ``gpuwatchd.sources.nvml.worker.doctor`` in a child process with a deadline and collect what it printed.

The child is in its own session and killed as a group at the deadline; the lines it wrote before hanging still
count, and the last ``gpu_start`` names the GPU it hung on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.doctor.context import Host
from gpuwatchd.runtime.json_answer import json_objects

PROBE_MODULE = "gpuwatchd.sources.nvml.worker.doctor"
# Each GPU's PCIe replay counter is read again this long after its first read: replays in a few seconds say more
# than a total since the driver loaded (a healthy Gen3 x4 link allows ~2 a minute; a bad cable makes 100+).
REPLAY_WINDOW_SECONDS = 2.0


@dataclass
class NvmlFacts:
    init: str | None = None  # "ok" or the reason (library_not_found, lib_rm_version_mismatch, ...)
    init_message: str = ""
    system: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    # GPU index -> (replays counted over the window, its seconds): the second read of each GPU's replay counter
    replays: dict[int, tuple[int, float]] = field(default_factory=dict)
    timed_out: bool = False
    hung_gpu: int | None = None  # index of the GPU the probe was reading when the deadline passed
    error: str | None = None  # the probe itself failed (could not start, crashed)

    @property
    def ok(self) -> bool:
        return self.init == "ok" and not self.timed_out and self.error is None


@dataclass
class ChildRun:
    """What a probe child printed before it exited or was killed at the deadline."""

    out: str
    err: str
    returncode: int | None
    timed_out: bool


def run_child(host: Host, argv: list[str]) -> ChildRun:
    """``argv`` in its own session with the host's library environment, killed as a group at the deadline.

    Raises OSError when it cannot start."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.library_env(),
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=host.deadline)
        return ChildRun(out, err, proc.returncode, False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return ChildRun(out, err, None, True)
    except BaseException:
        # Interrupted (Ctrl-C): the probe group goes too, reaped, not left to the garbage collector still running.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def probe_nvml(host: Host) -> NvmlFacts:
    facts = NvmlFacts()
    try:
        run = run_child(host, [host.python, "-m", PROBE_MODULE, "--replay-window", f"{REPLAY_WINDOW_SECONDS:g}"])
    except OSError as e:
        facts.error = f"could not start the NVML probe: {e}"
        return facts
    out, err, facts.timed_out = run.out, run.err, run.timed_out
    current: int | None = None
    for msg in json_objects(out):  # bounded: the interpreter of --python may print anything
        if "init" in msg:
            facts.init, facts.init_message = msg["init"], msg.get("message", "")
        elif "system" in msg:
            facts.system = msg["system"]
        elif "gpu_start" in msg:
            current = msg["gpu_start"]
        elif "gpu" in msg:
            facts.gpus.append(msg["gpu"])
            current = None
        elif "replays" in msg:
            r = msg["replays"]
            before = next((g.get("pcie_replay_counter") for g in facts.gpus if g.get("index") == r.get("index")), None)
            if isinstance(before, int) and isinstance(r.get("counter"), int):
                facts.replays[r["index"]] = (r["counter"] - before, float(r.get("seconds") or 0.0))
            current = None
    if facts.timed_out:
        facts.hung_gpu = current
    elif run.returncode != 0 or facts.init is None:
        last = (err.strip().splitlines() or ["no output"])[-1]
        facts.error = f"the NVML probe exited with {run.returncode}: {last}"
    return facts
