"""Recent Xids and falls off the bus from the kernel log, decoded by the kernel-log source's own parser
(``sources/kmsg/parse.py``): the live ring ``/dev/kmsg`` under the host's root, or a pasted log file
(``--kernel-log FILE``, any format ``gpuwatchd sim --kernel-log`` reads). Used when no daemon answers; a running
daemon's recent Xids (NVML events and the kernel log, de-duplicated) come from its status instead."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatchd.config.files import InputFileError, read_bytes_file, shown_path
from gpuwatchd.doctor.context import Host
from gpuwatchd.sim.kmsg_replay import MAX_KERNEL_LOG_BYTES
from gpuwatchd.sim.kmsg_text import parse_text
from gpuwatchd.sources.kmsg.parse import FallenOffBus, KernelEvent, Xid, classify_message, parse_record
from gpuwatchd.sources.kmsg.reader import READ_SIZE, RecordSplitter


@dataclass
class KernelLog:
    """What the log says: Xids (with the store's bus id form) and falls off the bus, or why it could not be read."""

    source: str
    xids: list[Xid] = field(default_factory=list)
    fallen: list[FallenOffBus] = field(default_factory=list)
    error: str | None = None


def _collect(log: KernelLog, events: list[KernelEvent | None]) -> None:
    for ev in events:
        if isinstance(ev, Xid):
            log.xids.append(ev)
        elif isinstance(ev, FallenOffBus):
            log.fallen.append(ev)


def read_file(path: Path) -> KernelLog:
    """A pasted kernel log (dmesg, dmesg -T, dmesg -x, journalctl -k, /dev/kmsg records)."""
    log = KernelLog(shown_path(path))
    try:
        data = read_bytes_file(path, max_bytes=MAX_KERNEL_LOG_BYTES)
    except InputFileError as e:
        log.error = f"cannot read {shown_path(path)}: {e}"
        return log
    for entry in parse_text(data):
        _collect(log, classify_message(entry.message))
    return log


def read_ring(host: Host) -> KernelLog:
    """Everything still in the kernel ring, read without blocking (each read of /dev/kmsg is one record)."""
    path = host.path("/dev/kmsg")
    log = KernelLog(str(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except PermissionError:
        log.error = (f"cannot read {path} (kernel.dmesg_restrict=1 needs root or CAP_SYSLOG): run doctor with sudo, "
                     "or pass --kernel-log with a saved `sudo dmesg`")  # fmt: skip
        return log
    except OSError as e:
        log.error = f"cannot read {path}: {e.strerror}"
        return log
    chunks: list[bytes] = []
    read = 0
    try:
        while True:
            try:
                chunk = os.read(fd, READ_SIZE)
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while reading: go on from the oldest kept
                    continue
                if e.errno == errno.EAGAIN:  # the end of the ring
                    break
                log.error = f"cannot read {path}: {e.strerror}"  # a directory, a device that refuses reads
                break
            if not chunk:  # a regular file (a test's or a simulation's): its end
                break
            chunks.append(chunk)
            read += len(chunk)
            if read > MAX_KERNEL_LOG_BYTES:  # a real ring holds at most a few MiB; /dev/zero under --root never ends
                log.error = f"{path}: more than {MAX_KERNEL_LOG_BYTES >> 20} MiB, read no further"
                break
    finally:
        os.close(fd)
    # split once, when everything is read: feeding a growing buffer chunk by chunk re-splits it each time
    splitter = RecordSplitter()
    records = splitter.feed(b"".join(chunks))
    records += splitter.flush()
    for raw in records:
        rec = parse_record(raw)
        if rec is not None:
            _collect(log, classify_message(rec.message))
    return log
