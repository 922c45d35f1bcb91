"""`gpuwatchd sim` as users run it: named scenarios end to end over HTTP, then Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, DaemonProcess, free_port, metrics_when, value, wait_until


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    running: list[DaemonProcess] = []
    yield running
    for d in running:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def start_sim(running: list[DaemonProcess], tmp_path: Path, *args: str) -> DaemonProcess:
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", tmp_path / "unused.yml", log_path)
    running.append(d)

    def serving() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{d.log()}"
        try:
            return d.get("/healthz", timeout=1)[0] == 200
        except OSError:
            return False

    wait_until(serving, "gpuwatchd sim to serve")
    return d


def interrupt(d: DaemonProcess) -> int:
    d.proc.send_signal(signal.SIGINT)
    return d.proc.wait(timeout=30)


def test_sim_no_driver(sim: list[DaemonProcess], tmp_path: Path) -> None:
    d = start_sim(sim, tmp_path, "--scenario", "no-driver")
    samples = metrics_when(d, lambda m: value(m, "gpuwatchd_nvml_up") == 0, "nvml_up 0")
    assert value(samples, "gpuwatchd_nvml_error_info", reason="library_not_found") == 1
    assert value(samples, "gpuwatchd_gpus") == 0
    status, body = d.get("/readyz")
    assert status == 200, body  # ready: a definite "no driver" is an answer
    assert d.log().count("no NVIDIA driver found") == 1
    assert interrupt(d) == 0


def test_sim_nvml_hang(sim: list[DaemonProcess], tmp_path: Path) -> None:
    # At 4x, the hang starts 1.25 s in and lasts 15 s; the 5 s poll deadline is 1.25 s.
    d = start_sim(sim, tmp_path, "--scenario", "nvml-hang", "--speed", "4")
    metrics_when(d, lambda m: value(m, "gpuwatchd_gpus") == 2, "both GPUs")
    metrics_when(d, lambda m: value(m, "gpuwatchd_nvml_stale") == 1, "nvml_stale 1 while GPU 1 hangs")
    samples = metrics_when(
        d, lambda m: (value(m, "gpuwatchd_nvml_worker_restarts_total") or 0) >= 1, "the hung worker replaced"
    )
    assert value(samples, "gpuwatchd_nvml_up") is not None  # still exporting while the worker is replaced
    assert d.get("/healthz")[0] == 200
    assert interrupt(d) == 0
