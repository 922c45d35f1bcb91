"""Waiting in async tests for something a running daemon will do: poll a condition until it holds, with a liveness
bound (generous on a loaded machine) rather than a timed assertion."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

WAIT_S = 120.0  # liveness bound on a loaded machine; each wait returns as soon as its condition holds


async def until(cond: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """``cond()``'s first true result; AssertionError naming ``what`` after ``timeout`` seconds without one."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not (result := cond()):
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return result
