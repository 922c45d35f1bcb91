"""Baselines per GPU UUID survive a restart; a corrupt file is set aside and rebuilt."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuwatchd.probes.baseline import FILE_NAME, Baselines


def test_median_of_first_n_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    b = Baselines(path, runs=3)
    for v in (10.0, 30.0, 20.0, 1.0):  # the fourth is past N: not part of the baseline
        assert b.baseline("GPU-a", "pcie.h2d") is None or v == 1.0
        b.add("GPU-a", {"pcie.h2d": v})
    assert b.baseline("GPU-a", "pcie.h2d") == 20.0
    again = Baselines(path, runs=3)  # a daemon restart
    assert again.baseline("GPU-a", "pcie.h2d") == 20.0
    assert again.baseline("GPU-b", "pcie.h2d") is None
    assert again.resets == 0


@pytest.mark.parametrize("text", [
    "{not json", '{"version": 1, "gpus": {"GPU-a": {"pcie.h2d": ["x"]}}}', "[]",
    b"\xff\xfe{}", "[" * 100_000, '{"version": 1, "gpus": {"GPU-a": {"pcie.h2d": [1e999]}}}',
    '{"version": 1, "gpus": {"GPU-a": {"pcie.h2d": [' + "1" * 4301 + "]}}}",
])
def test_corrupt_file_is_rebuilt_with_a_log_line(tmp_path: Path, text: str | bytes,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / FILE_NAME
    raw = text if isinstance(text, bytes) else text.encode()
    path.write_bytes(raw)
    with caplog.at_level(logging.WARNING):
        b = Baselines(path, runs=2)
    assert b.resets == 1
    assert "probe baselines in" in caplog.text and "rebuilding them from the next runs" in caplog.text
    (aside,) = tmp_path.glob(FILE_NAME + ".corrupt-*")
    assert aside.read_bytes() == raw
    b.add("GPU-a", {"gemm.flops_float32": 5.0})
    b.add("GPU-a", {"gemm.flops_float32": 7.0})
    assert Baselines(path, runs=2).baseline("GPU-a", "gemm.flops_float32") == 6.0
