"""A real full disk: the state dir on a 1 MiB tmpfs, the receiver down, notifications queued while it is full.

Without a tmpfs (mount not permitted: not root, a container without CAP_SYS_ADMIN) these skip; the same paths are
driven through the connection seam in ``test_writer_held.py``. The loss bound checked here is the one documented in
docs/notifications.md ("When the state directory is full").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwatchd.notify.store import DB_NAME
from tests.notify.conftest import Request, Sink

CHILD = Path(__file__).with_name("disk_child.py")
REPO = Path(__file__).resolve().parents[3]
WAIT = 60.0  # liveness bound for each condition (a busy machine), never a timing assertion


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the full-disk path is covered through the seam in test_writer_held.py")
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]
    done = subprocess.run(mount, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here ({done.stderr.strip()}); covered by test_writer_held.py")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        return (await asyncio.wait_for(self.proc.stdout.readline(), WAIT)).decode().strip()

    async def stats(self) -> dict[str, Any]:
        return json.loads(await self.ask("stats"))  # type: ignore[no-any-return]

    async def stored_alerts(self, n: int) -> None:
        """GPUs 0..n-1 firing, their notifications queued and on disk."""
        assert await self.ask(f"alerts {n}") == "ok"
        await self.until(f"{n} stored", lambda s: s["depth"] == n and s["held"] == 0 and s["settled"])

    async def until(self, what: str, cond: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            s = await self.stats()
            if cond(s):
                return s
            assert loop.time() < deadline, f"timed out waiting for {what}; last stats {s}"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def child(state_dir: Path, url: str) -> AsyncIterator[Child]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(state_dir), url,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), WAIT)).strip() == b"ready"
        yield Child(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        # Read the pipes to their end so their transports close before the loop does.
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.stdout is not None:
            await proc.stdout.read()


class Receiver:
    """The sink's answers: 503 while down; records the idempotency keys and GPUs it acknowledged with a 200."""

    def __init__(self, sink: Sink) -> None:
        self.up = False
        self.acked: list[tuple[str, str]] = []
        sink.responder = self.respond

    def respond(self, req: Request) -> web.Response:
        if not self.up:
            return web.Response(status=503, text="down")
        self.acked.append((req.headers["Idempotency-Key"], req.json["alerts"][0]["labels"]["uuid"]))
        return web.Response(text="ok")


def fill(mnt: Path) -> None:
    """Take every free byte left (again: the daemon may have given some back by truncating its WAL)."""
    with (mnt / "filler").open("ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


async def fill_until_held(c: Child, mnt: Path, first: int) -> tuple[int, dict[str, Any]]:
    """Queue one more GPU's alert at a time on the full disk until some are held in memory only; returns the count."""
    n = first
    while True:
        fill(mnt)
        n += 1
        assert n < first + 200, "the full disk never refused a write"
        assert await c.ask(f"alerts {n}") == "ok"
        # settled: the gauge read below counts every write tried so far (one still queued for the thread is lost on
        # a SIGKILL without being counted)
        s = await c.until(f"notification {n} queued", lambda s, n=n: s["depth"] == n and s["settled"])
        if s["unpersisted"] >= 3:
            return n, s


async def test_full_disk_then_space_then_receiver_everything_delivered_once(sink: Sink, small_fs: Path) -> None:
    receiver = Receiver(sink)
    async with child(small_fs / "state", sink.url) as c:
        await c.stored_alerts(5)
        n, s = await fill_until_held(c, small_fs, 5)
        assert not s["writable"] and s["failures"] > 0
        (small_fs / "filler").unlink()
        await c.until("the held writes stored", lambda s: s["held"] == 0 and s["writable"])
        receiver.up = True
        await c.until("the queue delivered", lambda s: s["depth"] == 0)
        await asyncio.sleep(0.5)  # several evaluations: any extra notification would show up now
    keys = [k for k, _ in receiver.acked]
    assert len(keys) == len(set(keys)) == n
    assert sorted(u for _, u in receiver.acked) == [f"GPU-{i:03d}" for i in range(n)]


async def test_sigkill_while_full_loses_at_most_the_unpersisted_gauge(sink: Sink, small_fs: Path) -> None:
    receiver = Receiver(sink)
    state = small_fs / "state"
    async with child(state, sink.url) as c:
        await c.stored_alerts(5)
        n, s = await fill_until_held(c, small_fs, 5)
        c.proc.send_signal(signal.SIGKILL)
        await c.proc.wait()
    unpersisted = s["unpersisted"]  # read after the last notification was queued, before the kill
    (small_fs / "filler").unlink()
    receiver.up = True
    async with child(state, sink.url) as c:
        # Nothing is reported yet: what gets delivered is exactly what the database kept.
        await c.until("the kept queue delivered", lambda s: s["depth"] == 0)
        kept = len(receiver.acked)
        assert n - unpersisted <= kept <= n
        # The rules report the still-firing alerts again after a restart: the lost ones are queued anew, the
        # delivered ones are not repeated (the notification log survived).
        assert await c.ask(f"alerts {n}") == "ok"
        await c.until("the re-reported alerts delivered", lambda s: s["depth"] == 0 and len(receiver.acked) >= n)
        await asyncio.sleep(0.5)
    assert sorted(u for _, u in receiver.acked) == [f"GPU-{i:03d}" for i in range(n)]


async def test_a_start_on_a_full_disk_runs_and_takes_the_file_in_once_space_returns(sink: Sink, small_fs: Path) -> None:
    receiver = Receiver(sink)
    state = small_fs / "state"
    async with child(state, sink.url) as c:
        await c.stored_alerts(5)
        c.proc.send_signal(signal.SIGKILL)
        await c.proc.wait()
    # As a clean stop leaves it: the WAL checkpointed and removed, so the next open needs room to create it again.
    with contextlib.closing(sqlite3.connect(state / DB_NAME)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert not Path(f"{state / DB_NAME}-wal").exists()
    fill(small_fs)
    async with child(state, sink.url) as c:  # systemd restarting it while the disk is full: it must start
        s = await c.stats()
        assert not s["writable"] and s["depth"] == 0
        assert await c.ask("alerts 8") == "ok"  # the rules report the still-firing alerts again
        await c.until("8 queued in memory", lambda s: s["depth"] == 8 and s["unpersisted"] == 8)
        (small_fs / "filler").unlink()
        # The file opens; its 5 old rows are replaced by the newer ones for the same GPUs.
        await c.until("the file opened and the held writes stored", lambda s: s["writable"] and s["held"] == 0)
        assert (await c.stats())["depth"] == 8
        receiver.up = True
        await c.until("the queue delivered", lambda s: s["depth"] == 0)
        await asyncio.sleep(0.5)
    keys = [k for k, _ in receiver.acked]
    assert len(keys) == len(set(keys)) == 8
    assert sorted(u for _, u in receiver.acked) == [f"GPU-{i:03d}" for i in range(8)]
    assert not [p for p in state.iterdir() if ".corrupt-" in p.name]
