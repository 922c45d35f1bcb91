"""The NVML outage log: one line per outage or change of reason, one when NVML is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.config import NvmlConfig
from gpuwatchd.model import Snapshot
from gpuwatchd.nvml_outage import NvmlOutageLog


def down(reason: str) -> Snapshot:
    return Snapshot(timestamp=0.0, nvml_ok=False, nvml_error=reason)


UP = Snapshot(timestamp=0.0, nvml_ok=True, driver_version="535.161.08")


def test_each_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gpuwatchd.daemon")
    outage = NvmlOutageLog()
    nvml = NvmlConfig()
    for snap in [down("library_not_found")] * 5 + [down("driver_not_loaded")] * 3 + [UP, UP, down("timeout")]:
        outage.observe(snap, nvml)
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "no NVIDIA driver found (libnvidia-ml.so.1 not on the library search path: library_not_found)",
        "no NVIDIA driver found (libnvidia-ml.so.1 found but the nvidia kernel module is not loaded: "
        "driver_not_loaded)",
        "NVML is up: driver 535.161.08, 0 GPU(s)",
        "NVML unavailable (timeout)",
    ]
    assert (
        caplog.records[0]
        .getMessage()
        .endswith("retrying every 30s at most. To try gpuwatchd without a GPU: gpuwatchd sim --scenario idle")
    )


def test_names_the_configured_library_path(caplog: pytest.LogCaptureFixture) -> None:
    NvmlOutageLog().observe(down("library_not_found"), NvmlConfig(library_path=Path("/opt/nvidia/lib")))
    assert "(libnvidia-ml.so.1 not in /opt/nvidia/lib: library_not_found)" in caplog.text
