"""Run ``gpuwatchd.sources.nvml_doctor`` in a child process with a deadline and collect what it printed.

The child is in its own session and killed as a group at the deadline; the lines it wrote before hanging still
count, and the last ``gpu_start`` names the GPU it hung on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.doctor.context import Host

PROBE_MODULE = "gpuwatchd.sources.nvml_doctor"


@dataclass
class NvmlFacts:
    init: str | None = None  # "ok" or the reason (library_not_found, lib_rm_version_mismatch, ...)
    init_message: str = ""
    system: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    hung_gpu: int | None = None  # index of the GPU the probe was reading when the deadline passed
    error: str | None = None  # the probe itself failed (could not start, crashed)

    @property
    def ok(self) -> bool:
        return self.init == "ok" and not self.timed_out and self.error is None


def probe_nvml(host: Host) -> NvmlFacts:
    facts = NvmlFacts()
    try:
        proc = subprocess.Popen(
            [host.python, "-m", PROBE_MODULE], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=host.library_env(), start_new_session=True, text=True,
        )  # fmt: skip
    except OSError as e:
        facts.error = f"could not start the NVML probe: {e}"
        return facts
    try:
        out, err = proc.communicate(timeout=host.deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        facts.timed_out = True
    current: int | None = None
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "init" in msg:
            facts.init, facts.init_message = msg["init"], msg.get("message", "")
        elif "system" in msg:
            facts.system = msg["system"]
        elif "gpu_start" in msg:
            current = msg["gpu_start"]
        elif "gpu" in msg:
            facts.gpus.append(msg["gpu"])
            current = None
    if facts.timed_out:
        facts.hung_gpu = current
    elif proc.returncode != 0 or facts.init is None:
        last = (err.strip().splitlines() or ["no output"])[-1]
        facts.error = f"the NVML probe exited with {proc.returncode}: {last}"
    return facts
