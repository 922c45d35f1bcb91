"""``gpuwatchd status``, ``status --watch`` and ``silence list`` against a real HTTP server answering with hostile
text (process and user names, Xid text, dock names, alert summaries, silence comments): escape sequences, CR,
backspace, bidi overrides and rich markup reach the terminal as ``?`` or as plain text, a 1 MB name is cut, and
the watch view does not die on ``[/bold]`` (rich's MarkupError)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwatchd.runtime.terminal import MAX_CHARS, terminal_safe

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "2000"}
EVIL = "x\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\\rback\x08\u202egnp.exe[/bold][link=http://e]"
BAD = ("\x1b", "\x07", "\r", "\x08", "\u202e", "\x9b")
UUID = "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30"


def _status() -> dict[str, Any]:
    return {
        "daemon": {"version": "9.9" + EVIL, "host": "desk" + EVIL},
        "nvml": {"ok": True, "driver_version": "550" + EVIL},
        "gpus": [{"uuid": UUID, "index": 0, "name": "RTX" + EVIL, "state": "present",
                  "readings": {"memory_used_bytes": 2**30, "memory_total_bytes": 2**34},
                  "processes": [{"pid": 4242, "name": "p" + EVIL, "user": "u" + EVIL, "used_memory_bytes": 2**30,
                                 "owner": {"container_id": "c" + EVIL, "name": EVIL, "image": "i" + EVIL}},
                                {"pid": 4243, "name": "long" + "n" * 1_000_000, "user": "bob",
                                 "used_memory_bytes": 2**29}],
                  "health": {"state": "degraded", "reason": "r" + EVIL, "action_text": "a" + EVIL}}],
        "docks": [{"vendor": "v" + EVIL, "name": "d" + EVIL, "unique_id": "u", "route": "1-1", "authorized": False,
                   "action": "boltctl" + EVIL}],
        "xid_counts": [{"uuid": UUID, "xid": 79, "count": 1, "catalog": {"mnemonic": "m" + EVIL}}],
    }


ALERTS = [{"labels": {"alertname": "GpuMemoryLeak" + EVIL, "gpu": "0", "severity": "critical"}, "state": "firing",
           "annotations": {"summary": "python" + EVIL + " grows"}, "status": {"state": "active"}}]
SILENCES = [{"id": "abc", "status": {"state": "active"}, "endsAt": "2999-01-01T00:00:00Z", "createdBy": "me" + EVIL,
             "comment": "c" + EVIL, "matchers": [{"name": "pid", "value": "1" + EVIL, "isRegex": False}]}]


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def status(_: web.Request) -> web.Response:
        return web.json_response(_status())

    async def alerts(_: web.Request) -> web.Response:
        return web.json_response(ALERTS)

    async def silences(_: web.Request) -> web.Response:
        return web.json_response(SILENCES)

    app = web.Application()
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/silences", silences)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _run(*args: str, until: str | None = None, timeout: float = 120.0) -> tuple[int | None, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpuwatchd", *args, cwd=ROOT, env=ENV,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    if until is None:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    buf = b""
    try:
        async with asyncio.timeout(timeout):
            while until.encode() not in buf:
                chunk = await proc.stdout.read(65536)
                assert chunk, (buf.decode(errors="replace")[-2000:], (await proc.stderr.read()).decode())
                buf += chunk
    finally:
        proc.terminate()
        await proc.wait()
    return None, buf.decode(errors="replace"), (await proc.stderr.read()).decode(errors="replace")


def _assert_safe(out: str) -> None:
    for c in BAD:
        assert c not in out, (repr(c), out[:3000])
    assert "evil.example" in out  # shown as text, never a link escape
    assert max(len(line) for line in out.splitlines()) < 5000  # the 1 MB name is cut


async def test_status_prints_hostile_text_as_plain_characters(server: str) -> None:
    rc, out, err = await _run("status", "--url", server)
    assert rc == 0, err
    _assert_safe(out)
    assert "px?[2J?]0;pwned??]8;;http://evil.example/?\\?back??gnp.exe[/bold]" in out


async def test_watch_view_survives_markup_and_prints_no_escape_sequences(server: str) -> None:
    _, out, err = await _run("status", "--watch", "0.5", "--url", server, until="ALERT")
    assert "Traceback" not in err and "MarkupError" not in err, err
    _assert_safe(out)
    assert "[/bold][link=http://e]" in out  # markup shown as text


async def test_silence_list_prints_hostile_comments_as_plain_characters(server: str) -> None:
    rc, out, err = await _run("silence", "list", "--url", server)
    assert rc == 0, err
    for c in BAD:
        assert c not in out, (repr(c), out)
    assert "— cx?[2J" in out


def test_terminal_safe_keeps_printable_unicode_and_cuts() -> None:
    assert terminal_safe("büro-rechner 中文 ✓") == "büro-rechner 中文 ✓"
    assert terminal_safe("a\u200bb\u2066c\x7fd\x85e") == "a?b?c?d?e"
    assert terminal_safe("n" * 1000) == "n" * (MAX_CHARS - 1) + "…"
    assert json.dumps(terminal_safe(EVIL)).isascii()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "empty"])
async def test_silence_token_file_is_read_capped_and_never_blocks(tmp_path: Path, kind: str) -> None:
    """``--token-file`` goes through the reader of every user-named file: a FIFO blocked the command for good and
    /dev/zero was read without end; each is now a one-line error, exit 2."""
    token = tmp_path / "token"
    if kind == "fifo":
        os.mkfifo(token)
    elif kind == "dev-zero":
        token.symlink_to("/dev/zero")
    else:
        token.write_text("\n")
    rc, _, err = await _run("silence", "list", "--token-file", str(token), "--url", "http://127.0.0.1:9",
                              timeout=60)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--token-file" in err
