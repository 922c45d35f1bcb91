"""The NVML worker is a second interpreter: what it imports is memory the host pays twice (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuwatchd import model
from gpuwatchd.sources.nvml import protocol as worker_protocol


def test_lost_reasons_are_spelled_alike_on_both_sides() -> None:
    assert (worker_protocol.HANG_SUSPECTED, worker_protocol.HUNG) == (model.HANG_SUSPECTED, model.HUNG)


def test_the_worker_loads_neither_the_model_nor_the_daemon_stack() -> None:
    code = ("import json, sys; import gpuwatchd.sources.nvml.worker.main; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('gpuwatchd', 'aiohttp', 'prometheus_client', 'pydantic', 'yaml', 'torch'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(r.stdout))
    assert "gpuwatchd.model" not in loaded
    assert not {m for m in loaded if not m.startswith("gpuwatchd")}, loaded
