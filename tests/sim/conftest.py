"""In-process access to the stand-in through the real pynvml (tests may import pynvml; the package may not)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state


@dataclass
class Sim:
    """A stand-in loaded into this process's pynvml, driven by one state file."""

    nvml: ModuleType
    lib: ctypes.CDLL
    write: Callable[[dict[str, Any]], Path]
    path: Path
    state: dict[str, Any] = field(default_factory=dict)

    def update(self, state: dict[str, Any]) -> None:
        """Replace the state file (the stand-in picks it up on its next call)."""
        self.state = state
        self.write(state)

    def handles(self) -> list[Any]:
        return [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]


def _load(libdir: Path) -> ctypes.CDLL:
    """Seed pynvml with the stand-in at ``libdir``: the in-process substitute for LD_LIBRARY_PATH."""
    _shutdown_all()
    lib = ctypes.CDLL(str(libdir / "libnvidia-ml.so.1"))
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0
    return lib


def _shutdown_all() -> None:
    """Drop every NVML reference this process holds, so the next test starts from an uninitialized library."""
    if pynvml.nvmlLib is None:
        return
    fn = pynvml.nvmlLib.nvmlShutdown
    for _ in range(64):
        if fn() != 0:
            break
    pynvml._nvmlLib_refcount = 0


@pytest.fixture
def sim(
    standin_libdir: Path, write_sim_state: Callable[[dict[str, Any]], Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sim]:
    """A two-GPU stand-in loaded into pynvml (not yet initialized); ``sim.update(state)`` changes what it serves."""
    state = make_state(2)
    path = write_sim_state(state)
    monkeypatch.setenv(STATE_ENV, str(path))
    lib = _load(standin_libdir)
    yield Sim(nvml=pynvml, lib=lib, write=write_sim_state, path=path, state=state)
    _shutdown_all()
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()


@pytest.fixture
def load_standin() -> Iterator[Callable[[Path], ctypes.CDLL]]:
    """Load another stand-in build (e.g. one with omitted symbols) into pynvml for this test."""
    yield _load
    _shutdown_all()
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
