"""The client commands (``status``, ``status --watch``, ``silence``, ``notify test --url``, ``doctor --url``) against a
real HTTP server that answers like a hostile or broken daemon (issue 34): nested 100k deep, the wrong shapes, 60 MB,
never, and text full of terminal control sequences. Each is one line naming the URL, never a traceback; memory stays
bounded; a bad ``--timeout`` is refused by the parser; the silence commands' output goes through a real pty clean.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "200"}
NOT_OURS = "answered something that is not a gpuwatchd"
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example/\x1b\\\x07\u202egnp\x9b"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")
MAX_RSS_MB = 400  # a 60 MB answer took 3.4 GiB; capped at 16 MiB before decoding, the client stays far below this

ANSWERS: dict[str, bytes] = {
    "deep-array": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "number": b"5",
    "gpus-not-a-list": b'{"gpus": 5, "nvml": {}, "results": 7, "silenceID": 3}',
    "nvml-a-list": b'{"nvml": [], "gpus": []}',
    "processes-an-object": b'{"gpus": [{"uuid": "GPU-1", "processes": {"pid": 1}}]}',
    "not-json": b"<html>502 Bad Gateway</html>",
    "big": b'{"a": "' + b"x" * (60 << 20) + b'"}',
}


class HostileServer:
    """An aiohttp server in a thread answering every request with ``ANSWERS[mode]`` (or never, for "tarpit")."""

    def __init__(self) -> None:
        self.mode = "deep-array"
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _answer(self, request: web.Request) -> web.Response:
        if self.mode == "tarpit":
            await asyncio.sleep(3600)
        if self.mode == "control":
            return web.json_response(_control_answer(request))
        if self.mode == "control-error":
            return web.json_response({"error": "no such silence" + EVIL}, status=404)
        return web.Response(body=ANSWERS[self.mode], content_type="application/json")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> HostileServer:
        self._thread.start()
        assert self._ready.wait(60)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)


def _control_answer(request: web.Request) -> Any:
    if request.method == "POST":
        return {"silenceID": "s" + EVIL, "results": [{"line": "slack: 200" + EVIL, "ok": True}]}
    return [{"id": "i" + EVIL, "status": {"state": "active" + EVIL}, "createdBy": "me" + EVIL, "comment": "c" + EVIL,
             "endsAt": "2999-01-01T00:00:00Z", "matchers": [{"name": "a" + EVIL, "value": "b" + EVIL}]}]


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    with HostileServer() as s:
        yield s


def _run(*args: str, timeout: float = 300) -> tuple[int, str, str, float]:
    """Run a command; its exit code, stdout, stderr and peak RSS in MB (its own, from wait4)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killer = threading.Timer(timeout, proc.kill)  # a net for a command that never ends (the assertion then fails)
    killer.start()
    try:
        err_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read() if proc.stderr else b""))
        reader.start()
        out = proc.stdout.read() if proc.stdout else b""
        reader.join()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        killer.cancel()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    return proc.returncode, out.decode(errors="replace"), b"".join(err_chunks).decode(errors="replace"), (
        usage.ru_maxrss / 1024)


COMMANDS = {
    "status": ["status"],
    "silence-list": ["silence", "list"],
    "silence-add": ["silence", "add", "alertname=GpuLost"],
    "silence-expire": ["silence", "expire", "abc"],
    "notify-test": ["notify", "test"],
    "doctor": ["doctor"],
}


@pytest.mark.parametrize("mode", ["deep-array", "deep-object", "gpus-not-a-list", "not-json"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_client_says_one_line_on_a_hostile_answer(server: HostileServer, mode: str, command: str) -> None:
    server.mode = mode
    rc, out, err, _ = _run(*COMMANDS[command], "--url", server.url)
    assert "Traceback" not in out + err, err[-3000:]
    if command == "silence-expire" and mode == "gpus-not-a-list":
        return  # a 200 to a DELETE is all the API answers: "expired" is right
    assert rc != 0, (out, err)
    assert NOT_OURS in out + err, (out, err)
    if command != "doctor":  # doctor reports it as its "daemon running" check among the others
        assert len(err.strip().splitlines()) == 1, err
        assert server.url in err


@pytest.mark.parametrize("mode", ["nvml-a-list", "processes-an-object", "number"])
def test_status_of_the_wrong_shape_is_one_line(server: HostileServer, mode: str) -> None:
    server.mode = mode
    rc, _out, err, _ = _run("status", "--url", server.url)
    assert rc == 3 and "Traceback" not in err and NOT_OURS in err and len(err.strip().splitlines()) == 1, err


def test_a_60_mb_answer_is_refused_with_bounded_memory(server: HostileServer) -> None:
    server.mode = "big"
    rc, _out, err, rss = _run("status", "--url", server.url, "--timeout", "120")
    assert rc == 3 and "Traceback" not in err, err
    assert NOT_OURS in err and "larger than 16 MiB" in err, err
    assert rss < MAX_RSS_MB, rss


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "1e999", "-inf", "100000"])
@pytest.mark.parametrize("command", ["status", "silence-list", "notify-test"])
def test_bad_timeouts_are_refused_by_the_parser(server: HostileServer, value: str, command: str) -> None:
    server.mode = "tarpit"
    rc, _out, err, _ = _run(*COMMANDS[command], "--url", server.url, f"--timeout={value}", timeout=120)
    assert rc == 2 and "Traceback" not in err, err
    assert "argument --timeout" in err and "must be a number of seconds above 0" in err, err


@pytest.mark.parametrize("command", ["status", "silence-list", "silence-add", "notify-test", "doctor"])
def test_a_tarpit_ends_at_the_timeout(server: HostileServer, command: str) -> None:
    """Nothing ever answers: each command ends by its own deadline (the test's 120 s is only a net)."""
    server.mode = "tarpit"
    rc, out, err, _ = _run(*COMMANDS[command], "--url", server.url,
                           *(["--deadline", "1"] if command == "doctor" else ["--timeout", "1"]), timeout=120)
    assert rc != 0 and "Traceback" not in out + err, err
    assert "timed out" in out + err or "TimeoutError" in out + err, (out, err)


@pytest.mark.parametrize(("mode", "command"), [("control", "silence-list"), ("control", "silence-add"),
                                               ("control-error", "silence-expire"), ("control", "notify-test")])
def test_silence_output_reaches_a_real_terminal_without_control_sequences(
    server: HostileServer, mode: str, command: str
) -> None:
    server.mode = mode
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatchd", *COMMANDS[command], "--url", server.url],
                          cwd=str(ROOT), env=ENV, dimensions=(50, 200), timeout=120, encoding="utf-8",
                          codec_errors="replace")
    child.expect(pexpect.EOF)
    child.close()
    seen = child.before
    assert "Traceback" not in seen, seen
    for c in RAW:
        assert c not in seen, (repr(c), seen)
    assert "evil.example" in seen  # shown as text
    assert "?]0;pwned?" in seen


def test_json_output_of_silence_list_is_escaped(server: HostileServer) -> None:
    server.mode = "control"
    rc, out, err, _ = _run("silence", "list", "--json", "--url", server.url)
    assert rc == 0, err
    assert out.isascii() and json.loads(out)[0]["createdBy"] == "me" + EVIL
