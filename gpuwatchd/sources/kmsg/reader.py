"""Reads kernel-log records and hands them to :class:`~gpuwatchd.sources.kmsg.ingest.KernelLogIngest`.

``kernel_log.path`` is ``/dev/kmsg`` on a host. A character device or a FIFO is read non-blocking from the event
loop's ``add_reader`` (one record per ``read`` on /dev/kmsg; ``EPIPE`` means the ring overwrote records we had not
read yet, and the next read goes on with the oldest one left); a regular file (``gpuwatchd sim --kernel-log`` writes
one) is followed like ``tail -f``, checked every :data:`FOLLOW_INTERVAL` seconds. Both split the bytes into
records the same way and share the parser and everything after it.

Restarts: the last sequence number applied, the boot it belongs to and the address -> UUID map are saved in
``kernel_log.state_file`` (atomic replace, written from a thread, at most every :data:`SAVE_INTERVAL` seconds and
at stop). At start the ring is read from its oldest record and everything at or below the saved number is
skipped, so nothing is counted or alerted twice; a gap in the numbers (ring wrapped while we were down, or while
we were slow) is counted in ``gpuwatchd_kernel_log_records_lost_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from gpuwatchd.model import KernelLogLoss, KernelLogRead, KernelLogUp, SourceStatus, StateFileSetAside
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.runtime.log_limit import LogLimit
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import parse_record
from gpuwatchd.state_files import StateFileError, read_json, set_aside

log = logging.getLogger(__name__)

READ_SIZE = 16384  # a /dev/kmsg record is at most ~8 KiB (message + dictionary); a smaller buffer gets EINVAL
MAX_RECORD_BYTES = READ_SIZE  # longer records (only a forged replay file has them) are cut here and counted
# Work done per event-loop turn before yielding: a flood (100k Xid lines at once, a 31 MB line) is read in slices
# of this size, so /healthz, scrapes and the NVML poll go on between them (a slice is ~10 ms of parsing on a busy
# core; bench/kmsg_flood.py measures the longest wait it causes).
MAX_BYTES_PER_TURN = 64 * 1024
MAX_RECORDS_PER_TURN = 256
FOLLOW_INTERVAL = 0.2  # seconds between checks of a followed regular file (sim replay)
SAVE_INTERVAL = 1.0  # seconds: the position is saved at most this often (and at stop)
RETRY_INTERVAL = 60.0  # seconds between attempts to open a log we could not open (permissions do not change often)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
STATE_VERSION = 1


class RecordSplitter:
    """Bytes -> records: a header line ``prio,seq,usec,flags;msg`` plus the dictionary lines after it (leading
    space). Holds an incomplete line until its newline arrives.

    Linear in the bytes fed: each byte is looked at once (a new chunk is searched for newlines, the held part never
    again), and a record longer than :data:`MAX_RECORD_BYTES` keeps its first ``MAX_RECORD_BYTES`` and is counted
    in ``cut``; the rest is skipped without being held.
    """

    def __init__(self) -> None:
        self._partial = bytearray()  # the line whose newline has not come yet (at most MAX_RECORD_BYTES of it)
        self._partial_cut = False
        self._current: list[bytes] = []
        self._current_size = 0
        self._current_cut = False
        self.cut = 0  # records cut to MAX_RECORD_BYTES

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            self._hold(data, start, nl)
            line = bytes(self._partial)
            cut = self._partial_cut
            self._partial.clear()
            self._partial_cut = False
            self._line(line, cut, out)
            start = nl + 1
        self._hold(data, start, len(data))
        return out

    def _hold(self, data: bytes, start: int, end: int) -> None:
        room = MAX_RECORD_BYTES - len(self._partial)
        if end - start > room:
            self._partial += data[start:start + max(room, 0)]
            self._partial_cut = True
        else:
            self._partial += data[start:end]

    def _line(self, line: bytes, cut: bool, out: list[bytes]) -> None:
        if line.startswith(b" "):
            if self._current:
                if self._current_size + len(line) + 1 > MAX_RECORD_BYTES:
                    self._current_cut = True
                else:
                    self._current.append(line)
                    self._current_size += len(line) + 1
            return
        self._emit(out)
        if line:
            self._current, self._current_size, self._current_cut = [line], len(line), cut

    def _emit(self, out: list[bytes]) -> None:
        if self._current:
            out.append(b"\n".join(self._current))
            self.cut += self._current_cut
        self._current, self._current_size, self._current_cut = [], 0, False

    def flush(self) -> list[bytes]:
        """The held record, once no more bytes are coming for now (its dictionary lines came in the same read)."""
        out: list[bytes] = []
        self._emit(out)
        return out


MAX_STATE_BYTES = 256 * 1024  # the file holds a boot id, a number and at most MAX_ADDRESSES short pairs


def load_state(path: Path, set_aside_counts: dict[str, int] | None = None) -> dict[str, Any]:
    """The saved position; an unreadable, corrupt or foreign file is moved aside (``.corrupt-<time>``), logged and
    counted in ``set_aside_counts["kernel_log"]``, and counts as none: it never stops the daemon."""
    try:
        data = read_json(path, MAX_STATE_BYTES)
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise StateFileError(f"not a version-{STATE_VERSION} kernel-log position file")
    except StateFileError as e:
        aside = set_aside(path)
        if set_aside_counts is not None:
            set_aside_counts["kernel_log"] = set_aside_counts.get("kernel_log", 0) + 1
        log.warning("kernel log: the saved position in %s is unusable (%s); reading the ring as on a first start%s",
                    path, e, f"; the file is kept as {aside}" if aside is not None else "")
        return {}
    addresses = data.get("addresses")
    seq = data.get("seq")
    boot_id = data.get("boot_id")
    return {
        "boot_id": boot_id[:64] if isinstance(boot_id, str) else None,
        "seq": seq if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq < 2**64 else None,
        "addresses": {k: v for k, v in addresses.items() if isinstance(k, str) and isinstance(v, str) and len(v) <= 64}
        if isinstance(addresses, dict) else {},
    }


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Atomic: write a temporary file, fsync, rename over the old one (a crash leaves the old or the new)."""
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps({"version": STATE_VERSION, **state}, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return "unknown-boot"


class KmsgReader:
    """Reads ``path`` until stopped; see the module docstring."""

    def __init__(self, path: Path, ingest: KernelLogIngest, *, clock: Clock, state_file: Path | None,
                 backlog_horizon: float | None = None) -> None:
        self.path = path
        # First read of a boot's ring (no saved position for it: a new install, a lost state file): records older
        # than this many seconds happened before anyone watched. Counting them as new Xids would make every
        # counter series born at once, which the shipped Prometheus rule reads as a new Xid (docs/kernel-log.md);
        # the daemon's own Xid rule ignores events older than rules.xid.resolve_after, which is what the daemon
        # passes here, so both agree on what is news.
        self.backlog_horizon = backlog_horizon
        self._history_skipped = 0
        self.ingest = ingest
        self.clock = clock
        self.state_file = state_file
        self._splitter = RecordSplitter()
        self._fd: int | None = None
        self._live = False  # a character device: record times come from the kernel's monotonic stamps
        self._event_driven = False  # a character device or FIFO: add_reader; a regular file: followed
        self._fresh_boot = True  # no saved position for this boot: the ring's backlog is history
        self._save_timer: asyncio.TimerHandle | None = None
        self._boot = ""
        self._skip_through: int | None = None  # saved seq: records up to it were applied before a restart
        self._expect: int | None = None  # next sequence number we should see
        self._dirty = False
        self._saving: asyncio.Task[None] | None = None
        self._last_save = 0.0
        self._readable = asyncio.Event()
        self._log_limit = LogLimit()

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Open (retrying while it fails), then read until cancelled. A read that fails (EIO, a path that turned out
        to be a directory) takes the source down and retries like a failed open; it never ends the task, which
        would stop the daemon."""
        aside: dict[str, int] = {}
        saved = load_state(self.state_file, aside) if self.state_file is not None else {}
        for name, count in aside.items():
            self.ingest.store.ingest(StateFileSetAside(name, count))
        self.ingest.load_addresses(saved.get("addresses", {}))
        while True:
            while not self._open(saved):
                await asyncio.sleep(RETRY_INTERVAL / self.clock.speed)
            try:
                await self._read()
            except OSError as e:
                self._down(e, reading=True)
            saved = self._state() if self.ingest.stats.last_seq is not None else saved  # go on after what was read
            await asyncio.sleep(RETRY_INTERVAL / self.clock.speed)

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._fd is not None
        try:
            if self._event_driven:
                loop.add_reader(self._fd, self._readable.set)
                while True:
                    if self._drain():
                        await asyncio.sleep(0)  # more is waiting: let the loop run, then go on
                        continue
                    await self._readable.wait()
                    self._readable.clear()
            else:
                while True:
                    await asyncio.sleep(0 if self._drain() else FOLLOW_INTERVAL)
        finally:
            if self._save_timer is not None:
                self._save_timer.cancel()
                self._save_timer = None
            if self._event_driven:
                loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
            self.ingest.store.ingest(KernelLogUp(False, self.ingest.stats.error))
            await self.flush_state()

    def _open(self, saved: dict[str, Any]) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            self._down(e)
            return False
        mode = os.fstat(fd).st_mode
        self._fd = fd
        cut, self._splitter = self._splitter.cut, RecordSplitter()  # nothing half-read survives a reopen
        self._splitter.cut = cut
        self._live = stat.S_ISCHR(mode)
        self._event_driven = stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
        st = os.fstat(fd)
        self._boot = _boot_id() if self._live else f"file:{st.st_dev}:{st.st_ino}"
        self._fresh_boot = not (saved.get("boot_id") == self._boot and saved.get("seq") is not None)
        if not self._fresh_boot:
            self._skip_through = saved["seq"]
            self._expect = saved["seq"] + 1
        stats = self.ingest.stats
        if not stats.up:
            log.info("kernel log: reading %s", self.path)
        self.ingest.store.ingest(KernelLogUp(True))
        self._status(True, None)
        return True

    def _down(self, e: OSError, *, reading: bool = False) -> None:
        stats = self.ingest.stats
        if reading:
            reason = f"cannot read {self.path}: {e.strerror or e}"
        elif e.errno in (errno.EACCES, errno.EPERM):
            reason = (f"permission denied reading {self.path} (kernel.dmesg_restrict=1 needs CAP_SYSLOG; "
                      "docs/kernel-log.md)")
        else:
            reason = f"cannot open {self.path}: {e.strerror or e}"
        if stats.error != reason:
            log.warning("kernel log source down: %s; Xids still come from NVML events", reason)
        self.ingest.store.ingest(KernelLogUp(False, reason))
        self._status(False, reason)

    def _status(self, ok: bool, error: str | None) -> None:
        self.ingest.store.ingest(
            SourceStatus(name="kernel_log", success=ok, duration_seconds=0.0, timestamp=self.clock.now(), error=error)
        )

    # -- reading --------------------------------------------------------------------------------------------------

    def _drain(self) -> bool:
        """Read what is available now, up to one turn's budget, apply it, and schedule a save. True when the budget
        ran out before the input did (call again after yielding to the loop)."""
        assert self._fd is not None
        got_any = False
        budget_bytes, budget_records = MAX_BYTES_PER_TURN, MAX_RECORDS_PER_TURN
        more = False
        while True:
            if budget_bytes <= 0 or budget_records <= 0:
                more = True
                break
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # records overwritten under us; the gap in sequence numbers counts them
                if e.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            got_any = True
            budget_bytes -= len(data)
            records = self._splitter.feed(data)
            if self._live:
                records += self._splitter.flush()  # /dev/kmsg: one whole record per read
            budget_records -= len(records)
            for raw in records:
                self._record(raw)
        if not more:
            for raw in self._splitter.flush():
                self._record(raw)
        self.ingest.store.ingest(KernelLogLoss(cut=self._splitter.cut))
        if got_any:
            self._schedule_save()
        return more

    def _record(self, raw: bytes) -> None:
        rec = parse_record(raw)
        if rec is None:  # no "prio,seq,usec;" header of ASCII numbers: one line, counted, dropped
            self.ingest.store.ingest(KernelLogRead(None, ("malformed",)))
            return
        if self._skip_through is not None and rec.seq <= self._skip_through:
            return
        if self._expect is not None and rec.seq > self._expect:
            lost = rec.seq - self._expect
            self.ingest.store.ingest(KernelLogLoss(lost=lost))
            self._log_limit.log(log, logging.WARNING, "lost", "kernel log: %d record(s) overwritten before they were"
                                " read (ring buffer wrapped)", lost)
        self._expect = rec.seq + 1
        self._skip_through = None
        t = self._stamp(rec.usec)
        history = (self._fresh_boot and self._live and self.backlog_horizon is not None
                   and t < self.clock.now() - self.backlog_horizon)
        if history:
            self._history_skipped += 1
        elif self._history_skipped:
            log.info("kernel log: %d record(s) from before the daemon watched this boot read for GPU addresses only",
                     self._history_skipped)
            self._history_skipped = 0
        self.ingest.apply(rec, t, history=history)
        self._dirty = True

    def _stamp(self, usec: int) -> float:
        """Daemon-clock time of a record: its age on the monotonic clock for the live ring; now for a replay."""
        now = self.clock.now()
        if not self._live:
            return now
        age = time.clock_gettime(time.CLOCK_MONOTONIC) - usec / 1e6
        return now - max(0.0, age)

    # -- state ----------------------------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {"boot_id": self._boot, "seq": self.ingest.stats.last_seq, "addresses": dict(self.ingest.addresses)}

    def _schedule_save(self) -> None:
        if self.state_file is None or (self._saving is not None and not self._saving.done()):
            return
        if time.monotonic() - self._last_save < SAVE_INTERVAL:
            if self._save_timer is None:
                self._save_timer = asyncio.get_running_loop().call_later(SAVE_INTERVAL, self._schedule_save_if_dirty)
            return
        self._saving = asyncio.ensure_future(self.flush_state())

    def _schedule_save_if_dirty(self) -> None:
        self._save_timer = None
        if self._dirty and self._fd is not None:
            self._schedule_save()

    async def flush_state(self) -> None:
        """Save the position now (from a thread: fsync must not stall the event loop)."""
        if self.state_file is None or not self._dirty or self.ingest.stats.last_seq is None:
            return
        self._dirty = False
        self._last_save = time.monotonic()
        try:
            await asyncio.to_thread(save_state, self.state_file, self._state())
        except OSError as e:
            self._dirty = True
            log.warning("kernel log: cannot save the position to %s: %s", self.state_file, e.strerror or e)

    async def stop(self) -> None:
        if self._save_timer is not None:
            self._save_timer.cancel()
        if self._saving is not None:
            with contextlib.suppress(Exception):
                await self._saving
        await self.flush_state()
