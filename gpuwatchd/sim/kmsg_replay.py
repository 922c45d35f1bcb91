"""The sim's kernel ring: a file of /dev/kmsg records the daemon's kernel-log source follows (``kernel_log.path``).

``gpuwatchd sim --kernel-log FILE`` parses a pasted log (``sim/kmsg_text.py``) and appends it here once the daemon
has its first NVML snapshot, so the log's PCI addresses map onto the simulated GPUs (``--from-xml``: the capture's
GPUs) as they would on the host; scenario ``kmsg`` steps append their lines at their time. The daemon reads this
file with the same parser and everything after it as the live ring.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatchd.config.files import InputFileError, read_bytes_file, shown_path
from gpuwatchd.sim.kmsg_text import Entry, parse_text, to_records

if TYPE_CHECKING:
    from gpuwatchd.sim.scenario import Scenario

# A day of a busy host's kernel log is a few MiB; 32 MiB bounds memory and parse time (~2 s) for any paste.
MAX_KERNEL_LOG_BYTES = 32 << 20


class KernelLogError(Exception):
    """A --kernel-log file that cannot be replayed; ``str`` is one line naming the file."""


def load_kernel_log(path: Path) -> list[Entry]:
    """The kernel entries of a pasted log (any format ``sim/kmsg_text.py`` knows); no kernel line is an error."""
    try:
        data = read_bytes_file(path, max_bytes=MAX_KERNEL_LOG_BYTES)
    except InputFileError as e:
        raise KernelLogError(f"--kernel-log {shown_path(path)}: {e}") from None
    entries = parse_text(data)
    if not entries:
        raise KernelLogError(f"--kernel-log {shown_path(path)}: no kernel log lines in the file")
    return entries


class ReplayRing:
    """Appends records with consecutive sequence numbers, one ``write`` per batch (O_APPEND: whole records)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._next_seq = 1
        path.write_bytes(b"")

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        data = to_records(entries, first_seq=self._next_seq)
        self._next_seq += len(entries)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def append_lines(self, lines: list[str]) -> None:
        """Scenario steps: bare kernel messages (any pasted format works too)."""
        self.append(parse_text("\n".join(lines).encode()))


async def feed_when_ready(ring: ReplayRing, entries: list[Entry], has_snapshot: Callable[[], bool]) -> None:
    """Append ``entries`` once ``has_snapshot()`` is true (the daemon knows the GPUs)."""
    while not has_snapshot():
        await asyncio.sleep(0.05)
    ring.append(entries)


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
