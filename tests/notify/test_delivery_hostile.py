"""Receivers that misbehave after or around their answer, over real TCP: a raw asyncio server answers 200 and then
dribbles its body (or reads ours slowly through a tiny receive buffer), or closes mid-body; another answers 429
with hostile ``Retry-After`` values. An accepted notification is delivered once, the other groups and the other
receiver are delivered meanwhile, retries back off whatever the header says, and no state write is lost."""

from __future__ import annotations

import asyncio
import itertools
import math
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from until import until

from gpuwatchd.notify.retry import MAX_RETRY_AFTER_SECONDS, parse_retry_after, retry_after_body
from gpuwatchd.runtime.clock import ScaledClock

from .conftest import Sink, make_dispatcher, mk_alert, notify_config, receiver

GROUPS = 16


@dataclass
class RawReceiver:
    """A receiver speaking HTTP by hand, so it can misbehave where aiohttp's server would not let it."""

    mode: str
    retry_after: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # monotonic time of each request's arrival
    url: str = ""
    _held: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        headers = dict(
            line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
        )
        self.keys.append(headers.get("Idempotency-Key", ""))
        self.times.append(time.monotonic())
        if self.mode == "dribble":
            # 200 at once, then a body without length, a byte now and then, never ending; our body read slowly.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\no")
            await writer.drain()
            self._held.append(writer)
            try:
                while True:
                    await reader.read(16)
                    writer.write(b"k")
                    await writer.drain()
                    await asyncio.sleep(0.5)
            except (ConnectionError, asyncio.CancelledError):
                return
        elif self.mode == "mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
            await writer.drain()
            writer.close()
        elif self.mode == "429":
            value = self.retry_after.pop(0) if self.retry_after else None
            if value is None:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            else:
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: " + value.encode() +
                             b"\r\nContent-Length: 4\r\nConnection: close\r\n\r\nslow")  # fmt: skip
            await writer.drain()
            await reader.read(1 << 20)
            writer.close()


@pytest.fixture
async def raw_receiver() -> AsyncIterator[RawReceiver]:
    r = RawReceiver("")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # reads our body slowly: a small window
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(r.handle, sock=sock)
    r.url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    yield r
    for w in r._held:
        w.close()
    server.close()


def _alerts(now: float) -> list:  # type: ignore[type-arg]
    return [mk_alert(uuid=f"GPU-{i:02d}", gpu=str(i), t=now, summary="x" * 2000) for i in range(GROUPS)]


@pytest.mark.parametrize("mode", ["dribble", "mid-body"])
async def test_an_accepted_notification_is_delivered_once_and_blocks_nothing(
    raw_receiver: RawReceiver, sink: Sink, tmp_path: Path, mode: str
) -> None:
    raw_receiver.mode = mode
    clock = ScaledClock(speed=20.0)
    config = notify_config(
        [receiver("stalling", "slack", raw_receiver.url, timeout="3s"), receiver("good", "webhook", sink.url)],
        group_wait="0s", group_by=["uuid"],
        routes=[{"matchers": [], "receiver": "stalling", "continue": True}, {"matchers": [], "receiver": "good"}],
    )  # fmt: skip
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update(_alerts(clock.now()))
        d.wake()
        rows = await until(lambda: (r := d.outbox.rows()) and len(r) == 2 * GROUPS
                           and all(x.status == "delivered" for x in r) and r, "every notification delivered")
        assert len(sink.requests) == GROUPS  # the other receiver: each group once
        # The stalling receiver: each group once, one request per notification, never the same key twice.
        assert len(raw_receiver.keys) == GROUPS == len(set(raw_receiver.keys)), raw_receiver.keys
        assert {r.idempotency_key for r in rows if r.receiver == "stalling"} == set(raw_receiver.keys)
        assert all(r.attempts == 1 for r in rows)
        assert sum(d.state.writer.stats.failures.values()) == 0 and d.state.writer.stats.dropped == 0
    finally:
        await d.stop()
    assert len(raw_receiver.keys) == GROUPS


HOSTILE_RETRY_AFTER = ["NaN", "-5", "0", "inf", "-inf", "1e999", "Mon, 99 Foo 2024", "1_0"]


async def test_hostile_retry_after_backs_off_and_keeps_every_state_write(
    raw_receiver: RawReceiver, tmp_path: Path
) -> None:
    raw_receiver.mode = "429"
    raw_receiver.retry_after = list(HOSTILE_RETRY_AFTER)
    n = len(raw_receiver.retry_after)
    speed = 50.0
    clock = ScaledClock(speed=speed)
    config = notify_config([receiver("r1", "slack", raw_receiver.url)], group_wait="0s",
                           retry_initial="1s", retry_max="8s")  # fmt: skip
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now())])
        d.wake()
        await until(lambda: len(raw_receiver.keys) == n + 1 and d.outbox.rows()[0].status == "delivered",
                    "delivered after the 429s")  # fmt: skip
        row = d.outbox.rows()[0]
        assert row.attempts == n + 1 and row.last_error is None
        assert len(set(raw_receiver.keys)) == 1
        # Each wait is at least the backoff's lower bound (initial x 1.5^(k-1) x 0.5 jitter, capped at retry_max)
        # in clock seconds, whatever Retry-After said ("0", "-5", NaN...): never retried at once.
        t = raw_receiver.times
        gaps = [(b - a) * speed for a, b in itertools.pairwise(t)]
        for k, gap in enumerate(gaps, 1):
            assert gap >= 0.5 * min(8.0, 1.0 * 1.5 ** (k - 1)) * 0.9, (k, gaps)
        assert sum(d.state.writer.stats.failures.values()) == 0 and d.state.writer.stats.dropped == 0
    finally:
        await d.stop()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7.0), ("1.5", 1.5), (" 30 ", 30.0), ("NaN", None), ("nan", None), ("inf", None), ("-inf", None),
        ("-5", None), ("1e999", None), ("1e3", None), ("9" * 300, MAX_RETRY_AFTER_SECONDS),
        ("99999999999", MAX_RETRY_AFTER_SECONDS), ("", None), ("١٣", None), ("1_0", None), ("0x10", None),
        ("Mon, 99 Foo 2024", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("x" * 10_000, None),
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_SECONDS),
    ],
)
def test_retry_after_is_parsed_defensively(value: str, expected: float | None) -> None:
    got = parse_retry_after(value, 1_700_000_000.0)
    assert got == expected and (got is None or math.isfinite(got))


@pytest.mark.parametrize(
    "body", [b'{"retry_after": NaN}', b'{"retry_after": 1e999}', b'{"retry_after": -1}', b"[" * 100_000,
             b'{"retry_after": ' + b"9" * 5000 + b"}", b'{"retry_after": "5"}'],
)
def test_discord_retry_after_body_is_parsed_defensively(body: bytes) -> None:
    assert retry_after_body(body) is None
