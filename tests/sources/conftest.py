"""Fixtures of the source tests: the real pynvml in this process, bound to the stand-in driver."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

InProcessNvml = Callable[[dict[str, Any]], Any]


@pytest.fixture
def inprocess_nvml(standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path],
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessNvml]:
    """``use(state) -> pynvml``: pynvml in this process on the stand-in serving ``state`` (NVML shut down after)."""
    import pynvml

    from gpuwatchd.sim.standin_abi import STATE_ENV

    def use(state: dict[str, Any]) -> Any:
        monkeypatch.setenv(STATE_ENV, str(write_sim_state(state)))
        monkeypatch.setattr(pynvml, "nvmlLib", ctypes.CDLL(str(standin_libdir / "libnvidia-ml.so.1")))
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
        pynvml._nvmlGetFunctionPointer_cache.clear()
        return pynvml

    yield use
    if pynvml.nvmlLib is not None:
        while pynvml.nvmlLib.nvmlShutdown() == 0:
            pass
    pynvml._nvmlGetFunctionPointer_cache.clear()
