"""A request body read as JSON within bounds: bytes actually read (chunked or not), time, nesting depth, numbers.

``Content-Length`` alone caps nothing: a chunked body has none. So the body is read in slices and refused as soon
as more than ``max_bytes`` arrived, all of it within ``timeout`` (a client dribbling a body holds a connection and
a handler, like a slowloris). The JSON is then held to a nesting depth and to numbers a silence can use, so that no
input reaches the C decoder's recursion limit or Python's int-to-str limit (both were 500s).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

# Deepest nesting accepted: a silence body is an object of lists of objects (depth 3).
MAX_DEPTH = 16
# Longest number literal: unix seconds with a fraction fit in 32 digits; anything longer is not a time or a count.
MAX_NUMBER_CHARS = 32
# Strings, or one bracket: scanned to measure nesting without recursion (strings may hold brackets). A string that
# never closes runs to the end of the body (or to a lone backslash there), so the pattern matches at the first quote
# whatever follows: one pass over the body. Requiring the closing quote made an unclosed string full of escaped
# quotes rescan the rest of the body from every one of them (quadratic: 63 KB stalled the loop 11 s).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


class BodyError(ValueError):
    """A body refused; ``status`` is the HTTP answer (400, 408, 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: web.BaseRequest, *, max_bytes: int, timeout: float) -> bytes:
    """The whole body, at most ``max_bytes`` bytes, read within ``timeout`` seconds."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise BodyError(413, f"body: larger than {max_bytes} bytes")
    try:
        return await asyncio.wait_for(_read_capped(request, max_bytes), timeout)
    except asyncio.TimeoutError:
        raise BodyError(408, f"body: not received within {timeout:g} s") from None
    except (web.RequestPayloadError, HttpProcessingError) as e:
        # Bad chunk framing, a body shorter than its Content-Length, bad compression: the client's fault.
        raise BodyError(400, f"body: {type(e).__name__}") from None


async def _read_capped(request: web.BaseRequest, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(min(65536, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise BodyError(413, f"body: larger than {max_bytes} bytes")
        chunks.append(chunk)


def check_depth(raw: bytes, max_depth: int = MAX_DEPTH) -> None:
    """BodyError if brackets nest deeper than ``max_depth`` (linear scan; strings skipped)."""
    depth = 0
    for m in _TOKENS.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                raise BodyError(400, f"body: JSON nested deeper than {max_depth}")
        elif tok in (b"]", b"}"):
            depth -= 1


def _number(text: str) -> float | int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"number longer than {MAX_NUMBER_CHARS} characters")
    value = float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """Strict, bounded JSON: UTF-8, no NaN/Infinity, numbers of at most ``MAX_NUMBER_CHARS``, ``MAX_DEPTH`` deep."""
    check_depth(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError(400, "body: not UTF-8") from None
    try:
        return json.loads(text, parse_int=_number, parse_float=_number, parse_constant=_constant)
    except (ValueError, RecursionError) as e:
        raise BodyError(400, f"body: expected JSON ({str(e)[:120]})") from None


async def read_json(request: web.BaseRequest, *, max_bytes: int, timeout: float) -> Any:
    """:func:`read_body` then :func:`parse_json`."""
    return parse_json(await read_body(request, max_bytes=max_bytes, timeout=timeout))
