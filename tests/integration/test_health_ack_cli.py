"""`gpuwatchd health ack` against a running daemon: recorded with the write token, refused without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import ROOT, DaemonProcess, metrics_when, value

from gpuwatchd.sim.state import make_state

TOKEN = "0123456789abcdef0123"


def _ack(d: DaemonProcess, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWATCHD_WRITE_TOKEN", None)
    if token is not None:
        env["GPUWATCHD_WRITE_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "gpuwatchd", "health", "ack", *args, "--url", d.url],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT, env=env)


def test_health_ack_from_the_shell(
    start_daemon: Callable[..., DaemonProcess],
    standin_libdir: Path,
    write_sim_state: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
) -> None:
    state = make_state(2)
    d = start_daemon({"nvml": {"library_path": str(standin_libdir), "poll_interval": "100ms"},
                      "notify": {"api": {"write_token": TOKEN}}}, write_sim_state(state))
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "two GPUs present")
    refused = _ack(d, "1")
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr
    unknown = _ack(d, "9", token=TOKEN)
    assert unknown.returncode == 1 and "no GPU '9'" in unknown.stderr
    done = _ack(d, "1", "--replaced", "--comment", "RMA 4711", "--by", "erin", token=TOKEN)
    uuid = state["devices"][1]["uuid"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{uuid} marked replaced")
    code, body = d.get("/api/v1/health/acks")
    assert code == 200
    assert [(a["uuid"], a["kind"], a["comment"], a["by"]) for a in json.loads(body)] == [
        (uuid, "replaced", "RMA 4711", "erin")]
    assert value(d.metrics(), "gpuwatchd_health_acks_total", kind="replaced") == 1
    assert "health ack: " in d.log()
