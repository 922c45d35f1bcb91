"""Helpers to run the NVML worker process directly against the stand-in driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuwatchd.model import Snapshot, snapshot_from_dict
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE

WORKER = [sys.executable, "-m", SIM_WORKER_MODULE]  # the worker with process names from the sim state


def worker_env(libdir: Path, state: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir), STATE_ENV: str(state)}


def run_worker(libdir: Path, state: Path, **opts: Any) -> tuple[int, list[dict[str, Any]], str]:
    """Run the worker to completion; (exit code, decoded lines after hello, stderr)."""
    opts.setdefault("interval", 0.0)
    opts.setdefault("max_polls", 1)
    r = subprocess.run(
        [*WORKER, json.dumps(opts)], env=worker_env(libdir, state), capture_output=True, text=True, timeout=60,
        check=False,
    )
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines and "hello" in lines[0], r.stderr
    return r.returncode, lines[1:], r.stderr


def snap(line: dict[str, Any]) -> Snapshot:
    return snapshot_from_dict({k: v for k, v in line.items() if k != "calls"})


class LiveWorker:
    """A worker left running, read line by line (for changes of state between polls)."""

    def __init__(self, libdir: Path, state: Path, **opts: Any) -> None:
        opts.setdefault("interval", 0.05)
        self.proc = subprocess.Popen(
            [*WORKER, json.dumps(opts)], env=worker_env(libdir, state), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        try:
            hello = json.loads(self.proc.stdout.readline())
            assert hello["hello"] == self.proc.pid
        except BaseException:
            self.close()  # a failed start leaves no worker running (nor a Popen warning "still running" later)
            raise

    def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker ended: {self.proc.wait()} {self.proc.stderr.read() if self.proc.stderr else ''}"
        return json.loads(line)  # type: ignore[no-any-return]

    def wait(self) -> int:
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
