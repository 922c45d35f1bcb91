"""Relays the NVML worker's stderr into the daemon's log: one record per line at the level the line names.

A message this worker or the previous one already wrote is relayed at DEBUG (an operator reads one line per
failure episode, not one per respawn). Output without the worker's line prefix (a Python traceback, a message
from a C library) is relayed as one WARNING block; its last line is kept as the worker's "last words" for the
exit message.
"""

from __future__ import annotations

import asyncio
import logging

from gpuwatchd.sources.nvml.protocol import LOG_LINE

log = logging.getLogger("gpuwatchd.sources.nvml.supervisor")  # one logger for everything about the worker

# Unexpected output (a traceback) is gathered into one log record; it ends at EOF, at a regular line, or after
# this many real seconds without another line (a traceback is written in one go).
BLOCK_IDLE_SECONDS = 0.2
# Lines kept per unexpected-output block: a traceback's tail says what happened; a worker printing without end
# must not grow the daemon.
BLOCK_MAX_LINES = 60
# A worker's log line is a sentence or a traceback line; anything longer is noise, dropped with one warning.
MAX_LINE_BYTES = 64 * 1024
CHUNK_BYTES = 64 * 1024
# Distinct worker messages remembered to relay repeats at DEBUG (bounded: a worker could vary its text).
MAX_REMEMBERED_LINES = 256


class StderrRelay:
    """Keeps what the previous and the current worker said; :meth:`relay` reads one worker's stderr."""

    def __init__(self) -> None:
        self._prev_lines: set[str] = set()  # messages the previous worker wrote (relayed again at DEBUG)
        self._cur_lines: set[str] = set()
        self.last_words: str | None = None  # the last unexpected stderr line of the current worker

    def next_worker(self) -> None:
        self._prev_lines, self._cur_lines = self._cur_lines, set()
        self.last_words = None

    async def relay(self, stream: asyncio.StreamReader, pid: int) -> None:
        """Until EOF. Read in chunks and split here, not with ``readline``: a line past the bound is dropped whole
        (one warning), where ``readline`` would raise and then hand over its tail as if it were a line."""
        block: list[str] = []
        pending = b""
        dropping = False  # inside a line too long to relay: skip up to its newline
        while True:
            try:
                if block:
                    chunk = await asyncio.wait_for(stream.read(CHUNK_BYTES), BLOCK_IDLE_SECONDS)
                else:
                    chunk = await stream.read(CHUNK_BYTES)
            except asyncio.TimeoutError:
                self._flush_block(block, pid)
                continue
            if not chunk:
                if pending and not dropping:
                    self._line(pending, block, pid)
                self._flush_block(block, pid)
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                if dropping:
                    dropping = False
                    continue
                self._line(raw, block, pid)
            if len(pending) > MAX_LINE_BYTES:
                if not dropping:
                    self._flush_block(block, pid)
                    self._relay(logging.WARNING, "a stderr line too long to relay (dropped)",
                                f"nvml_worker[{pid}]: %s")
                dropping, pending = True, b""

    def _line(self, raw: bytes, block: list[str], pid: int) -> None:
        text = raw.decode(errors="replace").rstrip()
        m = LOG_LINE.fullmatch(text)
        if m is None:
            if text.strip():
                block.append(text)
                self.last_words = text.strip()[:300]
                del block[:-BLOCK_MAX_LINES]
            return
        self._flush_block(block, pid)
        wpid, level, message = m.groups()
        self._relay(getattr(logging, level), message, f"nvml_worker[{wpid}]: %s")

    def _relay(self, level: int, message: str, fmt: str) -> None:
        if message in self._prev_lines or message in self._cur_lines:
            level = min(level, logging.DEBUG)
        if len(self._cur_lines) < MAX_REMEMBERED_LINES:
            self._cur_lines.add(message)
        log.log(level, fmt, message)

    def _flush_block(self, block: list[str], pid: int) -> None:
        if block:
            self._relay(logging.WARNING, "\n".join(block), f"unexpected output from the NVML worker [{pid}]:\n%s")
            block.clear()
