"""The sim's kernel ring: a file of /dev/kmsg records the daemon's kernel-log source follows (``kernel_log.path``).

``gpuwatchd sim --kernel-log FILE`` parses a pasted log (``sim/kmsg_text.py``) and appends it here once the daemon
has its first NVML snapshot, so the log's PCI addresses map onto the simulated GPUs (``--from-xml``: the capture's
GPUs) as they would on the host; scenario ``kmsg`` steps append their lines at their time. The daemon reads this
file with the same parser and everything after it as the live ring.

Parsing the paste and turning it into records run in a thread, in batches of :data:`REPLAY_BATCH` entries: done on
the daemon's event loop, a 31 MB, a binary or a 100k-line paste held ``/healthz`` 1.3-4.4 s once. The file is
capped at :data:`MAX_KERNEL_LOG_BYTES` and :data:`MAX_KERNEL_LOG_ENTRIES` entries.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatchd.config.files import InputFileError, read_bytes_file, shown_path
from gpuwatchd.sim.kmsg_text import Entry, parse_text, to_records

if TYPE_CHECKING:
    from gpuwatchd.sim.scenario import Scenario

# A day of a busy host's kernel log is a few MiB; 32 MiB bounds memory and parse time (~2 s) for any paste.
MAX_KERNEL_LOG_BYTES = 32 << 20
# Entries of one paste: 32 MiB of real lines (~100 bytes each) is ~330k; 32 MiB of one-character lines would be 16M
# entries (~2 GB of objects), so a paste past this is refused rather than held.
MAX_KERNEL_LOG_ENTRIES = 1 << 20
# Entries turned into records and written per thread hop: the daemon starts reading the first ones at once, and
# one batch's records are a few hundred KiB whatever the paste.
REPLAY_BATCH = 4096


class KernelLogError(Exception):
    """A --kernel-log file that cannot be replayed; ``str`` is one line naming the file."""


def load_kernel_log(path: Path) -> list[Entry]:
    """The kernel entries of a pasted log (any format ``sim/kmsg_text.py`` knows); no kernel line is an error."""
    try:
        data = read_bytes_file(path, max_bytes=MAX_KERNEL_LOG_BYTES)
    except InputFileError as e:
        raise KernelLogError(f"--kernel-log {shown_path(path)}: {e}") from None
    entries = parse_text(data, max_entries=MAX_KERNEL_LOG_ENTRIES + 1)
    if not entries:
        raise KernelLogError(f"--kernel-log {shown_path(path)}: no kernel log lines in the file")
    if len(entries) > MAX_KERNEL_LOG_ENTRIES:
        raise KernelLogError(f"--kernel-log {shown_path(path)}: more than {MAX_KERNEL_LOG_ENTRIES} kernel log "
                             "entries; replay a part of it")
    return entries


class ReplayRing:
    """Appends records with consecutive sequence numbers, one ``write`` per batch (O_APPEND: whole records).
    Thread-safe: the replay's thread and the scenario player's steps append to one ring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._next_seq = 1
        self._lock = threading.Lock()
        path.write_bytes(b"")

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        with self._lock:
            data = to_records(entries, first_seq=self._next_seq)
            self._next_seq += len(entries)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                view = memoryview(data)
                while view:  # a regular file takes it in one write; a short write must not lose the rest
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def append_lines(self, lines: list[str]) -> None:
        """Scenario steps: bare kernel messages (any pasted format works too)."""
        self.append(parse_text("\n".join(lines).encode()))


async def feed_when_ready(ring: ReplayRing, entries: list[Entry], has_snapshot: Callable[[], bool]) -> None:
    """Append ``entries`` once ``has_snapshot()`` is true (the daemon knows the GPUs), off the event loop."""
    while not has_snapshot():
        await asyncio.sleep(0.05)
    for i in range(0, len(entries), REPLAY_BATCH):
        await asyncio.to_thread(ring.append, entries[i:i + REPLAY_BATCH])


async def load_kernel_log_async(path: Path) -> list[Entry]:
    """:func:`load_kernel_log` in a thread."""
    return await asyncio.to_thread(load_kernel_log, path)


def due_lines(scenario: Scenario, since: float, until: float) -> list[str]:
    """Lines of the scenario's ``kmsg`` steps whose time falls in (since, until] (scenario seconds, loops too)."""
    steps = [s for s in scenario.steps if s.action == "kmsg"]
    if not steps or until <= since:
        return []
    cycles = range(1)
    if scenario.loop and scenario.duration > 0:
        cycles = range(max(0, math.floor(since / scenario.duration)), math.floor(until / scenario.duration) + 1)
    out: list[str] = []
    for cycle in cycles:
        base = cycle * scenario.duration if scenario.loop else 0.0
        for step in steps:
            if since < base + step.at <= until:
                out.extend(step.spec)
    return out
