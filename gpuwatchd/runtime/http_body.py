"""Reading an HTTP answer's body with a cap, for the daemon's own clients (delivery, status, probe).

``StreamReader.read(n)`` returns what one chunk holds, not ``n`` bytes: one call can cut a body that arrives in
several chunks, and an uncapped ``read()`` holds whatever a peer sends.
"""

from __future__ import annotations

from typing import Protocol


class _Stream(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


async def read_capped(stream: _Stream, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (the rest is left unread; the connection is then dropped)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
