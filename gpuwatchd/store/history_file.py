"""The daemon's side of rule-history persistence (format and checks in ``gpuwatchd.store.persist``): load once at
start, prune at the first snapshot, save every ``SAVE_INTERVAL`` and at stop, with its self-metrics.

A save appends what changed since the last one (``store/journal.py``) as one block, fsynced; the first save of a
run (and the one after a failed write, or when the file is not the one this run wrote) writes the file afresh,
atomically. Blocks whose points have all aged out are cut off by copying the rest to a new file (atomically, no
re-encoding) once they are a third of the file: the file holds the retention and at most half as much again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuwatchd.model import Snapshot
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.state_files import StateFileError, read_bytes, set_aside
from gpuwatchd.store import Store, persist
from gpuwatchd.store.journal import Journal, Mark

MAX_FILE_BYTES = 64 * 1024 * 1024  # compressed; what it decompresses to is bounded by persist.MAX_BYTES
# A file written afresh cuts the history into this many blocks by time, so it ages out a block at a time.
SLICES = 12

log = logging.getLogger(__name__)

# A minute of history lost at a crash is two leak evaluations: the onset (minutes to hours back) survives.
SAVE_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class _Extent:
    """A block of the file as written: its size in bytes and when all its points are past the retention."""

    size: int
    expires: float


def _write_fresh(path: Path, blocks: Sequence[persist.Block]) -> None:
    persist.write_atomic(path, [persist.MAGIC, *(part for b in blocks for part in (b.header, b.payload))])


def _append(path: Path, block: persist.Block, size: int) -> None:
    """Append ``block`` to the file this run wrote, ``size`` bytes long, and fsync it: a crash in between leaves a
    block cut short at the end, which loading drops."""
    with path.open("r+b") as f:
        if f.seek(0, os.SEEK_END) != size:
            raise OSError(f"{path} is not the file this daemon wrote ({size} bytes expected)")
        f.write(block.header)
        f.write(block.payload)
        f.flush()
        os.fsync(f.fileno())


def _cut(path: Path, extents: list[_Extent], horizon: float) -> list[_Extent]:
    """Cut off the oldest blocks whose points are all older than ``horizon`` once they are a third of the file, or
    whatever their size once the file is over half of what a load reads (``MAX_FILE_BYTES``): copied, not
    re-encoded (temporary file, fsync, rename, as ``write_atomic``). At least one block stays."""
    n = 0
    while n < len(extents) - 1 and extents[n].expires < horizon:
        n += 1
    old = sum(e.size for e in extents[:n])
    total = sum(e.size for e in extents)
    if not n or (old * 3 < total and total + len(persist.MAGIC) <= MAX_FILE_BYTES // 2):
        return extents
    tmp = path.with_name(path.name + ".tmp")
    with path.open("rb") as src, tmp.open("wb") as dst:
        src.seek(len(persist.MAGIC) + old)
        dst.write(persist.MAGIC)
        shutil.copyfileobj(src, dst, 1024 * 1024)
        dst.flush()
        os.fsync(dst.fileno())
    persist.rename_synced(tmp, path)
    return extents[n:]


def _saved(mark: Mark) -> list[Any]:
    """The points a journal mark holds: its anchor (when it has one) and the points after it."""
    return [mark.anchor, *mark.tail] if mark.anchor is not None else list(mark.tail)


def _last(points: Sequence[Any], n: int) -> Sequence[Any]:
    """The newest ``n`` points (a ring's rows are compared at its end only: 3 M points at 16 x 256)."""
    return points[len(points) - n:] if n <= len(points) else points


def _ends_with(tail_rows: list[list[Any]], ring_len: int, saved: list[list[Any]]) -> bool:
    """Whether a ring of ``ring_len`` points whose newest rows are ``tail_rows`` ends with the rows ``saved``."""
    return ring_len >= len(saved) and tail_rows == saved


class HistoryFile:
    """``<state_dir>/rule-history.z`` for one daemon run."""

    def __init__(self, state_dir: Path, store: Store, clock: Clock, *, interval: float = SAVE_INTERVAL) -> None:
        self.path = state_dir / persist.FILE_NAME
        self._store = store
        self._clock = clock
        self._interval = interval
        self._pending_prune = False
        self._lock = asyncio.Lock()
        self._journal = Journal()
        self._extents: list[_Extent] | None = None  # the blocks of the file this run wrote; None: write afresh
        self.load_errors = 0
        self.save_errors = 0
        self.restored = 0
        self.saved_bytes = 0

    def load(self) -> None:
        """Restore the saved history into the store; a missing file is a first start, a bad one starts empty."""
        try:
            data = read_bytes(self.path, MAX_FILE_BYTES)
        except StateFileError as e:
            self._load_failed(str(e))
            return
        if data is None:
            return
        try:
            hist = persist.decode(data)
        except persist.HistoryError as e:
            self._load_failed(str(e))
            return
        if hist.torn is not None:
            log.warning("rule history %s: %s dropped (a save cut short); the blocks before it are loaded",
                        self.path, hist.torn)
        self.restored = persist.restore(self._store, hist, self._clock.now())
        self._pending_prune = True
        log.info("rule history: %d series restored from %s", self.restored, self.path)
        self._adopt(hist, len(data))

    def _adopt(self, hist: persist.History, size: int) -> None:
        """Go on with the file just loaded as if this run had written it: its blocks become this run's, and the
        journal's marks the rings as restored, so the first save appends what came since instead of writing the
        file afresh (at 16 GPUs x 256 processes with an hour of history a full encode is 1.7-5 s of CPU and ~21 MB
        written at every start). Only when the file is version 2 and loaded whole, and every restored ring ends
        with the points the file's ring ends with (restoring drops points past now, from a clock that went back,
        and sorts): otherwise the first save writes it afresh, as before. Rings restored and then pruned (gone by
        the first snapshot) are listed as gone by that save; rings the file holds that were not restored (aged out)
        go with their blocks."""
        if hist.blocks is None or hist.torn is not None or size != len(persist.MAGIC) + sum(b for b, _ in hist.blocks):
            return
        delta = self._journal.collect(self._store, full=True)
        for gpu_key, mark in delta.gpu_marks.items():
            saved, gring = _saved(mark), hist.gpus.get(gpu_key, [])
            if not _ends_with(persist.gpu_rows(_last(gring, len(saved))), len(gring), persist.gpu_rows(saved)):
                return
        for proc_key, pmark in delta.proc_marks.items():
            psaved, pring = _saved(pmark), hist.procs.get(proc_key, [])
            if not _ends_with(persist.proc_rows(_last(pring, len(psaved))), len(pring), persist.proc_rows(psaved)):
                return
        self._journal.commit(delta)
        self._extents = [_Extent(b, expires) for b, expires in hist.blocks]
        self.saved_bytes = size

    def _load_failed(self, why: str) -> None:
        self.load_errors += 1
        counts = self._store.state_files_set_aside
        counts["rule_history"] = counts.get("rule_history", 0) + 1
        aside = set_aside(self.path)
        log.warning("rule history %s unusable: %s; starting with empty history%s", self.path, why,
                    f"; the file is kept as {aside}" if aside is not None else "")

    def on_snapshot(self, snap: Snapshot) -> None:
        """At the first snapshot after a restore: drop GPUs and processes that are gone (a reused pid starts
        afresh)."""
        if self._pending_prune and snap.nvml_ok:
            self._pending_prune = False
            dropped = persist.prune(self._store, snap)
            if dropped:
                log.info("rule history: %d restored series no longer exist, dropped", dropped)

    async def save(self) -> None:
        """Read what changed on the loop; encode and append it (or write the file afresh) in a thread."""
        async with self._lock:
            now = self._clock.now()
            extents = self._extents
            if extents is not None and self._size_on_disk() != sum(e.size for e in extents) + len(persist.MAGIC):
                extents = None  # moved, removed or written by someone else: start it again
            delta = self._journal.collect(self._store, full=extents is None)
            if extents is not None and delta.empty:
                return
            horizon = now - self._store.retention_seconds
            width = max(self._store.retention_seconds / SLICES, self._store.step_seconds)

            def write() -> list[_Extent]:
                if extents is None:
                    blocks = persist.encode_full(delta, now, width)
                    _write_fresh(self.path, blocks)
                    return [_Extent(b.size, b.expires) for b in blocks]
                block = persist.encode_delta(delta, now)
                _append(self.path, block, sum(e.size for e in extents) + len(persist.MAGIC))
                return _cut(self.path, [*extents, _Extent(block.size, block.expires)], horizon)

            try:
                written = await asyncio.to_thread(write)
            except OSError as e:
                self.save_errors += 1
                self._extents = None
                self._journal.reset()
                log.warning("rule history: cannot write %s (%s); kept in memory, retried in %.0fs",
                            self.path, e.strerror or e, self._interval)
                return
            self._journal.commit(delta)
            self._extents = written
            self.saved_bytes = sum(e.size for e in written) + len(persist.MAGIC)

    def _size_on_disk(self) -> int | None:
        try:
            return self.path.stat().st_size
        except OSError:
            return None

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self._interval)
            await self.save()

    def collector(self) -> Collector:
        return _HistoryCollector(self)


class _HistoryCollector(Collector):
    def __init__(self, owner: HistoryFile) -> None:
        self._h = owner

    def collect(self) -> Iterator[Metric]:
        h = self._h
        yield CounterMetricFamily(
            "gpuwatchd_rule_history_load_errors",
            "Rule history files found corrupt, truncated or hostile at start (the daemon started with empty history).",
            value=float(h.load_errors),
        )
        yield CounterMetricFamily(
            "gpuwatchd_rule_history_save_errors",
            "Rule history saves that failed (disk full, I/O error); the history stays in memory and is saved again.",
            value=float(h.save_errors),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_rule_history_restored_series",
            "History series (GPUs and processes) restored from the state directory at start.",
            value=float(h.restored),
        )
        yield GaugeMetricFamily(
            "gpuwatchd_rule_history_file_bytes", "Size of the last rule history file written.",
            value=float(h.saved_bytes),
        )
