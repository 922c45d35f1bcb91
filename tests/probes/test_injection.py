"""Probe faults are a simulation-only lever: never active under ``gpuwatchd run``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gpuwatchd
from gpuwatchd.probes.faults import ProbeFaults, faults_from_dict
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.store import Store

from .conftest import REPO
from .helpers import UUID, config, sim_state

PKG = Path(gpuwatchd.__file__).parent


def test_the_worker_refuses_injection_on_a_real_gpu() -> None:
    argv = [sys.executable, "-m", "gpuwatchd.probes.worker", "--device", "cuda", "--inject", '{"gemm_flip": 1}']
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--inject is for simulated GPUs (--device cpu) only" in proc.stderr


def test_run_builds_its_daemon_without_a_fault_source() -> None:
    """Only ``gpuwatchd sim`` hands the daemon a SimProbes; ``run`` (cli/commands.py) passes none."""
    # Parsed in a fresh interpreter: CPython 3.11's parser can fail with "AST constructor recursion depth mismatch"
    # in a test worker whose earlier tests exhausted the recursion limit (the hostile deep-JSON tests).
    script = (
        "import ast, pathlib, sys\n"
        "pkg = pathlib.Path(sys.argv[1])\n"
        "for path in sorted(pkg.rglob('*.py')):\n"
        "    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):\n"
        "        if isinstance(node, ast.Call) and any(k.arg == 'probe_sim' for k in node.keywords):\n"
        "            print(path.relative_to(pkg).as_posix())\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(PKG)], capture_output=True, text=True, check=True,
                         timeout=300)
    assert out.stdout.split() == ["sim/runner.py"], out.stderr


def test_a_real_daemon_service_never_passes_faults(tmp_path: Path) -> None:
    # Even with a stand-in state that asks for faults in the environment, a service without a sim source (what
    # `gpuwatchd run` builds) has no faults to pass and probes the cuda device.
    sim_state(tmp_path, {"gemm_flip": 1, "hang": True})
    svc = ProbeService(config(tmp_path), Store(), ManualClock(), None,
                       env={**os.environ, "GPUWATCHD_SIM_STATE": str(tmp_path / "standin-state")})
    assert svc.sim is None and svc.device == "cuda"
    assert "--inject" not in svc._argv(["gemm"], None)
    assert UUID  # the state above is for this GPU


def test_fault_validation_names_the_key() -> None:
    assert faults_from_dict({"gemm_flip": 1}) == ProbeFaults(gemm_flip=1)
    for bad, msg in [({"gemm_flop": 1}, "unknown probe fault 'gemm_flop'"),
                     ({"bandwidth_factor": 0}, "bandwidth_factor: expected a factor in (0, 10]"),
                     ({"crash": "boom"}, "crash: expected one of exit, segfault")]:
        try:
            faults_from_dict(bad)
        except ValueError as e:
            assert msg in str(e)
        else:
            raise AssertionError(f"{bad} accepted")
