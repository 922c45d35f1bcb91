"""The training socket's own failure paths: a path it must not take, a stale socket, another daemon's socket, too many
peers, a silent peer; each with its message and its counter, and the daemon never stopped by them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.config.training import TrainingConfig
from gpuwatchd.runtime.clock import RealClock
from gpuwatchd.sources.training.listener import TrainingListener, default_socket_path
from gpuwatchd.store import Store
from tests.until import until


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gw-l-"))  # a unix socket path has 107 bytes at most
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(path: Path, **cfg: Any) -> AsyncIterator[TrainingListener]:
    lst = TrainingListener(TrainingConfig(**cfg), Store(), RealClock(), path)
    task = asyncio.create_task(lst.run())
    try:
        await until(lambda: lst.store.training.status is not None, "the socket's first status")
        yield lst
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_path_that_is_not_a_socket_is_left_alone_and_said(short_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = short_dir / "training.sock"
    path.write_text("precious")
    async with serving(path) as lst:
        st = lst.store.training.status
        assert st is not None and not st.up and st.error is not None and "not a socket" in st.error
    assert path.read_text() == "precious"
    assert "training socket: cannot listen on" in caplog.text


async def test_a_stale_socket_is_replaced_and_removed_at_stop(short_dir: Path) -> None:
    path = short_dir / "training.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # a daemon that died: its file stays, nobody listens
    async with serving(path) as lst:
        assert lst.store.training.status is not None and lst.store.training.status.up
        assert oct(path.stat().st_mode & 0o777) == "0o666"
    assert not path.exists()


async def test_another_daemon_s_socket_is_not_taken(short_dir: Path) -> None:
    path = short_dir / "training.sock"
    async with serving(path) as first, serving(path) as second:
        assert first.store.training.status is not None and first.store.training.status.up
        st = second.store.training.status
        assert st is not None and not st.up and st.error is not None and "another gpuwatchd" in st.error


async def test_too_many_peers_and_silent_ones_are_closed(short_dir: Path) -> None:
    path = short_dir / "training.sock"
    async with serving(path, max_peers=1, idle_timeout=0.5) as lst:
        r1, w1 = await asyncio.open_unix_connection(str(path))
        await until(lambda: lst.peers == 1, "the first peer")
        r2, w2 = await asyncio.open_unix_connection(str(path))
        assert b"too many training processes" in await r2.readline()
        assert await r2.read() == b""
        w2.close()
        assert lst.connections["too_many_peers"] == 1
        # the first peer says nothing: closed after the idle timeout, its slot free again
        assert await asyncio.wait_for(r1.read(), 120) == b""
        w1.close()
        await until(lambda: lst.peers == 0, "the silent peer closed")
        st = lst.store.training.status
        assert st is not None and st.connections == {"accepted": 1, "too_many_peers": 1, "no_credentials": 0}


def test_the_socket_lives_in_the_runtime_directory(tmp_path: Path) -> None:
    assert default_socket_path({"RUNTIME_DIRECTORY": f"{tmp_path}/a:{tmp_path}/b"}) == tmp_path / "a" / "training.sock"
