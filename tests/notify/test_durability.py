"""SIGKILL mid-delivery, then restart: nothing lost, nothing acknowledged re-sent.

Over HTTP the honest guarantee is at-least-once: if the process dies after the receiver got a request but before
the 2xx was committed, that one notification is sent again after the restart — with the same Idempotency-Key, so
a receiver can drop it. Everything acknowledged before the kill is never sent again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from .conftest import Request, Sink

N = 6
HOLD_AT = 3  # the sink stalls the 3rd notification; the child is killed while that request is in flight
CHILD = Path(__file__).with_name("durability_child.py")
REPO = Path(__file__).resolve().parents[2]


async def spawn(state_dir: Path, url: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(state_dir), url, str(N), stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready"
    except BaseException:
        proc.kill()  # not left running and unreaped behind a failed start
        await proc.wait()
        raise
    return proc


async def test_sigkill_mid_delivery_then_restart(sink: Sink, tmp_path: Path) -> None:
    held = asyncio.Event()
    release = asyncio.Event()
    acknowledged: list[str] = []  # idempotency keys answered 200 before the kill
    killed = False

    async def respond(req: Request) -> web.Response:
        key = req.headers["Idempotency-Key"]
        if not killed and len(sink.requests) == HOLD_AT:
            held.set()
            await release.wait()  # answers only after the child died waiting (to a closed connection)
        if not killed:
            acknowledged.append(key)
        return web.Response(text="ok")

    sink.responder = respond
    proc = await spawn(tmp_path, sink.url)
    try:
        await asyncio.wait_for(held.wait(), 30)
        in_flight = sink.requests[HOLD_AT - 1].headers["Idempotency-Key"]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        killed = True
        release.set()
        before = len(sink.requests)
        assert before == HOLD_AT and len(acknowledged) == HOLD_AT - 1

        proc = await spawn(tmp_path, sink.url)
        await sink.wait_for(before + (N - HOLD_AT + 1))
        await asyncio.sleep(0.5)  # several evaluations of the restarted child: anything extra would show up now
    finally:
        proc.kill()
        await proc.wait()

    after = sink.requests[before:]
    after_keys = [r.headers["Idempotency-Key"] for r in after]
    # Nothing acknowledged is sent again.
    assert not set(after_keys) & set(acknowledged)
    # The in-flight one is re-sent once, first, with the same key: the receiver can tell it is a duplicate.
    assert after_keys[0] == in_flight
    assert len(after_keys) == len(set(after_keys)) == N - HOLD_AT + 1
    # Nothing is lost: every GPU's alert reached the sink, each notification once apart from that one duplicate.
    uuids = [r.json["alerts"][0]["labels"]["uuid"] for r in sink.requests]
    assert sorted(set(uuids)) == [f"GPU-{i:03d}" for i in range(N)]
    assert len(uuids) == N + 1
