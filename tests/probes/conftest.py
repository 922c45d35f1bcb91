"""Shared helpers of the probe tests: small CPU sizes, one torch import per test process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Small enough that a whole run takes about a second on a busy CPU, large enough to exercise every path.
CPU_ARGS = ["--device", "cpu", "--gemm-n", "96", "--memory-bytes", str(1 << 20), "--transfer-bytes", str(1 << 20)]


def worker_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "gpuwatchd.probes.worker", *CPU_ARGS, *extra]


@pytest.fixture(scope="session")
def torch_module():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch")
