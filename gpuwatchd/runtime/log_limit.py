"""Log lines whose rate someone else decides (one per kernel-log record, one per connection): at most one a minute
per key, the next one saying how many were left out. A flood of forged records must not become a flood of log."""

from __future__ import annotations

import logging
import time

INTERVAL_SECONDS = 60.0


class LogLimit:
    """``limit.log(logger, level, key, msg, *args)``: logs when ``key`` was not logged in the last minute."""

    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, logger: logging.Logger, level: int, key: str, msg: str, *args: object) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        self._last[key] = now
        if held:
            msg += " (%d more like it in the last minute, not logged)"
            args = (*args, held)
        logger.log(level, msg, *args)
        return True
