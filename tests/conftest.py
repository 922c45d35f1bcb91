"""Fixtures shared by every test package: the stand-in NVML driver and its state file."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tls_files import TlsFiles, make_tls_files

from gpuwatchd.model import STRICT_ENV, set_strict_snapshots
from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.state import RELOAD_CHECK_S, write_state

# A worker key no model field reads fails the test (in this process and in every daemon/sim it starts), where
# production drops it with a warning: a reading is one row, never silently lost on the way.
os.environ[STRICT_ENV] = "1"
set_strict_snapshots(True)


@pytest.fixture(autouse=True)
def _runtime_directory() -> Iterator[None]:
    """Each test's daemons (in process or children) put the training socket in a directory of the test's own, as
    systemd's RuntimeDirectory= gives one, never in the host's /run/gpuwatchd. Short: a unix socket path has 107
    bytes at most. Not through ``monkeypatch``: an autouse fixture asking for it would set it up before a test's
    event loop, so a test's own monkeypatching (of ``re.compile``, say) would still be in force while the loop is
    torn down."""
    path = tempfile.mkdtemp(prefix="gw-run-")
    before = os.environ.get("RUNTIME_DIRECTORY")
    os.environ["RUNTIME_DIRECTORY"] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RUNTIME_DIRECTORY", None)
        else:
            os.environ["RUNTIME_DIRECTORY"] = before
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def standin_libdir() -> Path:
    """Directory holding the stand-in ``libnvidia-ml.so.1`` (built once per session, cached across sessions)."""
    return build_standin()


@pytest.fixture
def write_sim_state(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """``write(state) -> path``: write a stand-in state to ``tmp_path/sim-state``; later calls replace it.

    A rewrite waits a few stand-in reload intervals, so the very next NVML call is guaranteed to see it.
    """
    path = tmp_path / "sim-state"

    def write(state: dict[str, Any]) -> Path:
        existed = path.exists()
        write_state(path, state)
        if existed:
            time.sleep(3 * RELOAD_CHECK_S)
        return path

    return write


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    """A self-signed certificate and key for 127.0.0.1 in ``tmp_path`` (the certificate is its own CA)."""
    return make_tls_files(tmp_path)
