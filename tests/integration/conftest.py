"""Fixtures of the integration tests: `gpuwatchd run` as a real process against the stand-in driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, START_SECONDS, DaemonProcess, free_port, wait_until

from gpuwatchd.sim.standin_abi import STATE_ENV


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """``start(config_dict, state_path=None) -> DaemonProcess`` once /healthz answers; stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(config: dict[str, Any], state_path: Path | None = None) -> DaemonProcess:
        n = len(started)
        port = free_port()
        cfg = {"state_dir": str(tmp_path / f"state{n}"), "sysfs": {"root": str(tmp_path / "sysfs")}, **config}
        cfg_path = tmp_path / f"gpuwatchd{n}.yml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        log_path = tmp_path / f"daemon{n}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if state_path is not None:
            env[STATE_ENV] = str(state_path)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwatchd", "run", "--config", str(cfg_path), "--listen", f"127.0.0.1:{port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
            )
        d = DaemonProcess(proc, f"http://127.0.0.1:{port}", cfg_path, log_path)
        started.append(d)

        def healthy() -> bool:
            assert proc.poll() is None, f"daemon exited with {proc.returncode}:\n{d.log()}"
            try:
                return d.get("/healthz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(healthy, "the daemon to serve /healthz", START_SECONDS)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
