"""Pasted kernel logs -> kernel-log entries, for ``gpuwatchd sim --kernel-log`` and scenario ``kmsg`` steps.

People paste what they have: plain ``dmesg`` (``[  219.524218] msg``), ``dmesg -T`` (``[Sun Feb 23 16:24:18
2025] msg``), ``dmesg -x`` (``kern  :warn  : [ 219.5] msg``, also with ``--time-format iso``), ``dmesg
--time-format iso`` (``2024-11-15T05:39:15,491363+00:00 msg``), ``journalctl -k`` and syslog files (``Jun 10
03:09:55 host kernel: msg``), raw ``/dev/kmsg`` records (``4,1234,219524218,-;msg``), or bare messages. A line
that starts with white space continues the previous entry (dmesg indents the later lines of a multi-line
printk). Syslog lines from programs other than ``kernel`` are dropped; every other line becomes an entry, and
whether it matters for a GPU is :func:`gpuwatchd.sources.kmsg.parse.classify`'s business, as on the live ring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuwatchd.sources.kmsg.parse import format_record, parse_record

MAX_STEP_LINES = 100  # kernel-log lines one scenario step may emit
MAX_LINE_CHARS = 1024  # the kernel's own limit for one printk line is about this

# dmesg -x: "kern  :warn  : "
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
_FACILITY = re.compile(r"^([a-z0-9]+)\s*:\s*(emerg|alert|crit|err|warn|notice|info|debug)\s*:\s?")
# Seconds since boot: ASCII digits (\d takes any script's), bounded (int() of 4301 digits raises).
_MONO = re.compile(r"^\[\s*([0-9]{1,12})\.([0-9]{1,12})\]\s?", re.ASCII)
_CTIME = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s?")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s")
# syslog / journalctl -k (short, short-precise, short-iso): TIME HOST PROGRAM[PID]: message. journalctl's ISO
# stamps have a "+0000" zone and a "." fraction; dmesg's have "+00:00" and ",", which keeps the two apart.
_SYSLOG = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?"
    r"(?:Z|[+-]\d{4})) (\S+) ([^\s:\[]+)(?:\[\d+\])?: ?"
)
_KMSG = re.compile(r"^[0-9]{1,4},[0-9]{1,20},[0-9]{1,20}(?:,[^;]*)?;", re.ASCII)
_KMSG_DICT = re.compile(r"^ [A-Z_]+=")  # the dictionary lines after a /dev/kmsg record


@dataclass(frozen=True, slots=True)
class Entry:
    """One kernel message from a pasted log (several lines for a multi-line printk)."""

    usec: int | None  # seconds-since-boot stamp when the format has one
    level: int
    message: str


# One entry's message, continuation lines included, is cut at this many characters: the kernel hands out a /dev/kmsg
# record of at most ~8 KiB (printk's LOG_LINE_MAX is 1 KiB a line), so nothing longer is a real kernel line, and a
# paste of millions of indented lines stays one bounded entry (joined once: appending to a growing string was
# quadratic, minutes for 4M continuation lines).
MAX_ENTRY_CHARS = 8192


def parse_text(data: bytes, *, max_entries: int | None = None) -> list[Entry]:
    """Every kernel entry of a pasted log, in order; each line decoded on its own (bad bytes -> U+FFFD). With
    ``max_entries``, parsing stops once that many are found (the caller refuses a paste that long)."""
    out: list[Entry] = []
    parts: list[str] = []  # the current entry's message lines
    size = 0
    head: Entry | None = None
    kmsg = False

    def close() -> None:
        if head is not None:
            out.append(Entry(head.usec, head.level, "\n".join(parts)[:MAX_ENTRY_CHARS]))

    for raw in data.split(b"\n"):
        line = raw[: MAX_ENTRY_CHARS * 4].decode("utf-8", "replace").rstrip("\r")
        if not line.strip() or (kmsg and _KMSG_DICT.match(line)):
            continue
        kmsg = bool(_KMSG.match(line))
        if line[0] in " \t" and head is not None and not _SYSLOG.match(line.lstrip()):
            if size < MAX_ENTRY_CHARS:  # past the cut the rest of the entry is dropped
                parts.append(line.strip())
                size += len(parts[-1]) + 1
            continue
        entry = _entry(line.strip())
        if entry is not None:
            close()
            if max_entries is not None and len(out) >= max_entries:
                return out
            head, parts, size = entry, [entry.message], len(entry.message)
    close()
    return out


def _entry(line: str) -> Entry | None:
    if _KMSG.match(line):
        rec = parse_record(line)
        return Entry(rec.usec, rec.level, rec.message) if rec is not None else None
    level = 4
    m = _SYSLOG.match(line)
    if m is not None:
        if m.group(2) != "kernel":
            return None  # another program's syslog line: not a kernel line
        line = line[m.end():]
    m = _FACILITY.match(line)
    if m is not None:
        if m.group(1) != "kern":
            return None  # dmesg -x of a userspace facility (printk from /dev/kmsg writers)
        level = _LEVELS[m.group(2)]
        line = line[m.end():]
    usec: int | None = None
    m = _MONO.match(line)
    if m is not None:
        usec = int(m.group(1)) * 1_000_000 + int(m.group(2).ljust(6, "0")[:6])
        line = line[m.end():]
    else:
        m = _CTIME.match(line) or _ISO.match(line)
        if m is not None:
            line = line[m.end():]
    return Entry(usec, level, line)


def to_records(entries: list[Entry], *, first_seq: int) -> bytes:
    """Entries as consecutive /dev/kmsg records starting at ``first_seq`` (what the replay file holds)."""
    chunks = []
    last = 0
    for i, e in enumerate(entries):
        last = e.usec if e.usec is not None else last
        chunks.append(format_record(first_seq + i, last, e.message, level=e.level))
    return b"".join(chunks)


def kmsg_step_lines(body: Any) -> tuple[str, ...]:
    """A scenario ``kmsg`` step's payload: kernel-log lines as ``dmesg`` prints them (any pasted format)."""
    lines = [body] if isinstance(body, str) else body
    if not isinstance(lines, list) or not lines or len(lines) > MAX_STEP_LINES:
        raise ValueError(f"kmsg: expected a list of 1 to {MAX_STEP_LINES} kernel log lines")
    for i, line in enumerate(lines):
        if not isinstance(line, str) or not line.strip() or len(line) > MAX_LINE_CHARS or "\n" in line:
            raise ValueError(f"kmsg[{i}]: expected one non-empty line of at most {MAX_LINE_CHARS} characters")
    return tuple(lines)
