"""read_capped: a body in many chunks is read whole up to the cap, never past it."""

from __future__ import annotations

import asyncio

from gpuwatchd.runtime.http_body import read_capped


async def _stream(chunks: list[bytes]) -> asyncio.StreamReader:
    s = asyncio.StreamReader()
    for c in chunks:
        s.feed_data(c)
    s.feed_eof()
    return s


async def test_a_body_in_several_chunks_is_read_whole() -> None:
    # one read(n) would return the first chunk only: the bug a single call had in `gpuwatchd probe --url`
    assert await read_capped(await _stream([b"{", b'"a"', b": 1}"]), 1000) == b'{"a": 1}'


async def test_the_cap_holds_and_the_rest_is_left_unread() -> None:
    s = await _stream([b"x" * 10, b"y" * 10])
    assert await read_capped(s, 15) == b"x" * 10 + b"y" * 5
    assert await s.read() == b"y" * 5
    assert await read_capped(await _stream([]), 10) == b""
