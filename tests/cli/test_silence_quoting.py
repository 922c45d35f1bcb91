"""``gpuwatchd silence add`` through the real CLI into a real silences API: what the shell passed is what the daemon
stores (the CLI's quoting and the daemon's Alertmanager unquoting agree), and what cannot be a silence is refused
and not kept (issue 34: ``pythön`` was stored as ``pythu00f6n``, a tab as ``t``, ``(a)\\1`` as ``(a)1``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gpuwatchd.notify.matchers import parse_matcher, quote, unquote
from gpuwatchd.runtime.clock import RealClock
from tests.notify.conftest import make_dispatcher, notify_config
from tests.notify.test_silences_limits import serve

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


async def _silence(url: str, *args: str) -> tuple[int, str]:
    # --timeout 120: the API is this test's own loop, which a loaded machine (CI beside other jobs) can keep from
    # answering within the CLI's default 5 s; a refused silence must say why, not time out.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuwatchd", "silence", "add", *args, "--url", url, "--timeout", "120", cwd=ROOT, env=ENV,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert b"Traceback" not in err, err.decode()
    return proc.returncode or 0, (out + err).decode(errors="replace")


@pytest.mark.parametrize(("arg", "name", "op", "value"), [
    ("process=pythön", "process", "=", "pythön"),
    ("process=a\tb", "process", "=", "a\tb"),
    ('process=say "hi"', "process", "=", 'say "hi"'),
    ("process=C:\\jobs\\x", "process", "=", "C:\\jobs\\x"),
    ('process=~"py\\d+"', "process", "=~", "py\\d+"),  # quoted as Alertmanager reads it: \d stays \d
    ('uuid!="GPU-1"', "uuid", "!=", "GPU-1"),
])
async def test_what_the_shell_passed_is_what_the_daemon_stores(
    tmp_path: Path, arg: str, name: str, op: str, value: str
) -> None:
    d = await make_dispatcher(notify_config([]), tmp_path, RealClock(), start=False)
    port, runner = await serve(d)
    try:
        rc, text = await _silence(f"http://127.0.0.1:{port}", "alertname=GpuLost", arg)
        assert rc == 0, text
        (s,) = d.silences.listing(d.now())
        got = {(m.name, m.op, m.value) for m in s.matchers}
        assert (name, op, value) in got, got
    finally:
        await runner.cleanup()
        d.state.close()


@pytest.mark.parametrize(("args", "why"), [
    (['process=~"(a)\\1"', "alertname=GpuLost"], "invalid regex"),  # a backreference: RE2 refuses it, nothing kept
    (['alertname=~".*"'], "narrows"),  # matches every alert
    (["alertname=GpuLost", "--for=-2h"], "--for"),
    (["alertname=GpuLost", "--for=0s"], "--for"),
])
async def test_what_cannot_be_a_silence_is_refused_and_not_kept(tmp_path: Path, args: list[str], why: str) -> None:
    d = await make_dispatcher(notify_config([]), tmp_path, RealClock(), start=False)
    port, runner = await serve(d)
    try:
        rc, text = await _silence(f"http://127.0.0.1:{port}", *args)
        assert rc in (1, 2) and why in text, text
        assert d.silences.listing(d.now()) == []
    finally:
        await runner.cleanup()
        d.state.close()


@pytest.mark.parametrize("value", ["pythön", "a\tb", "x\"y\\z", "l1\nl2", "\\d+", "(a)\\1", "", "\\", "\\\\n"])
def test_quote_and_unquote_round_trip(value: str) -> None:
    assert unquote(quote(value)[1:-1]) == value
    assert parse_matcher(f"n={quote(value)}").value == value
    assert str(parse_matcher(f"n={quote(value)}")) == f"n={quote(value)}"


def test_unquote_keeps_spurious_escapes_as_alertmanager_does() -> None:
    assert unquote(r"\d\.\1") == r"\d\.\1"
    assert unquote(r"a\"b\\c\nd") == 'a"b\\c\nd'
