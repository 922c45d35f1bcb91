"""Rule history that survives a restart: the store's history rings, saved to ``<state_dir>/rule-history.z``.

Without it a daemon restarted in the middle of a job (upgrade, reload, crash) misses the job's start: the leak
rule could not tell a saturating job seen from its middle from a leak, and a leak's onset was lost.

- Compact: only what the leak rule reads (GPU memory used/total/attributed; per process GPU memory and host
  RSS), as JSON arrays, zlib-compressed; bounded by the rings themselves (``history.retention`` / ``step``) and,
  on load, by ``MAX_SERIES`` / ``MAX_POINTS`` / ``MAX_BYTES`` / ``MAX_BLOCKS`` whatever the file says.
- Incremental (version 2): the file is ``MAGIC`` and a log of blocks, each ``[length, CRC-32]`` and a
  zlib-compressed JSON document of what changed since the block before (``store/journal.py``): per ring, how many
  of its newest saved points to drop and the points to append, or its whole history; and the rings that are
  gone. A save appends one block (the points of the last minute), not the whole history. A file written afresh
  (the first save of a run, after a failed write) cuts the history into blocks by time (``encode_full``), so
  blocks age out in order: once all the points of the oldest blocks are older than the retention, they are cut
  off by copying the others (``store/history_file.py``). Loading replays the blocks; a block cut short or
  damaged (a crash while appending) is dropped with all after it, the ones before load.
- Version 1 (one zlib-compressed JSON document of every ring, ``encode_rings``; written before the incremental
  save) is still read: a restart across the upgrade keeps its history.
- Off the event loop: the loop reads what changed (references to immutable points, no encoding), a thread
  encodes and appends it (fsync), or writes a temporary file, fsyncs and renames it over the old one (atomic: a
  crash leaves the old or the new).
- Loaded at start; points older than the retention or from the future are dropped, and at the first snapshot the
  history of GPUs and processes that no longer exist is dropped (``prune``), so a reused pid starts afresh.
- A corrupt or hostile file: start with empty history, one log line, ``gpuwatchd_rule_history_load_errors_total``.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gpuwatchd.model import Snapshot
from gpuwatchd.store import GpuPoint, ProcessPoint, Store, _proc_point
from gpuwatchd.store.journal import Delta

log = logging.getLogger(__name__)

FILE_NAME = "rule-history.z"
VERSION = 2
V1 = 1  # one document of every ring, rewritten at every save; still read
MAGIC = b"gpuwatchd rule history 2\n"  # a version 1 file starts with a zlib header (0x78)
FRAME = struct.Struct(">II")  # a block's header: the length of its payload, the payload's CRC-32
MAX_SERIES = 8192  # 64 GPUs x 128 processes
MAX_POINTS = 100_000  # per series; the rings hold retention/step + 2 (722 by default)
MAX_BYTES = 256 * 1024 * 1024  # decompressed, all blocks together; a zip bomb stops here
MAX_BLOCKS = 100_000  # a save a minute for two months
LEVEL = 6  # zlib


class HistoryError(ValueError):
    """The history file cannot be used (corrupt, truncated, hostile, another version)."""


@dataclass
class History:
    saved_at: float
    gpus: dict[str, list[GpuPoint]] = field(default_factory=dict)
    procs: dict[tuple[str, int], list[ProcessPoint]] = field(default_factory=dict)
    torn: str | None = None  # what was dropped from the end of the file, cut short or damaged
    # version 2: (bytes, expires) of each block loaded, as Block.size and Block.expires give them; None: version 1
    blocks: list[tuple[int, float]] | None = None


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a version 2 file, framed."""

    header: bytes
    payload: bytes
    # its newest point's time (the save's, if it has none): nothing in it is needed once that is past the retention
    expires: float

    @property
    def size(self) -> int:
        return len(self.header) + len(self.payload)


Rings = tuple[dict[str, Sequence[GpuPoint]], dict[tuple[str, int], Sequence[ProcessPoint]]]


def copy_rings(store: Store) -> Rings:
    """The rings as tuples: cheap, on the event loop; the points are immutable, so a thread can encode them."""
    return (
        {u: store.gpu_history(u) for u in store.gpu_keys()},
        {k: store.process_history(*k) for k in store.process_keys()},
    )


def _chunks(rings: Rings, now: float) -> Iterator[str]:
    """The file's JSON document, one ring at a time. Building the whole document first cost several times its
    size in Python lists at every save (~30 MB at 8 GPUs x 32 processes and the default hour of history), and
    that high-water mark stayed in the saving thread's malloc arena; a ring at a time bounds it by one ring."""
    gpus, procs = rings
    yield f'{{"v":{V1},"saved_at":{json.dumps(now)},"gpus":{{'
    for i, (u, pts) in enumerate(gpus.items()):
        body = [[p.t, p.memory_used_bytes, p.memory_total_bytes, p.processes_memory_bytes] for p in pts]
        yield ("," if i else "") + json.dumps(u) + ":" + json.dumps(body, separators=(",", ":"))
    yield '},"procs":['
    for i, ((u, pid), ppts) in enumerate(procs.items()):
        row = [u, pid, [[p.t, p.used_memory_bytes, p.host_rss_bytes] for p in ppts]]
        yield ("," if i else "") + json.dumps(row, separators=(",", ":"))
    yield "]}"


def encode_rings(rings: Rings, now: float) -> bytes:
    """A version 1 file: every ring, one document."""
    z = zlib.compressobj(LEVEL)
    out = [z.compress(chunk.encode()) for chunk in _chunks(rings, now)]
    out.append(z.flush())
    return b"".join(out)


def encode(store: Store, now: float) -> bytes:
    """A version 1 file of ``store``'s rings."""
    return encode_rings(copy_rings(store), now)


# -- version 2: a log of blocks -----------------------------------------------------------------------------------

_DUMPS = json.JSONEncoder(separators=(",", ":")).encode


def gpu_rows(pts: Iterable[GpuPoint]) -> list[list[Any]]:
    return [[p.t, p.memory_used_bytes, p.memory_total_bytes, p.processes_memory_bytes] for p in pts]


def proc_rows(pts: Iterable[ProcessPoint]) -> list[list[Any]]:
    return [[p.t, p.used_memory_bytes, p.host_rss_bytes] for p in pts]


class _BlockWriter:
    """One block's document, compressed as it is written, a ring at a time (memory bounded by one ring and the
    compressed output), in the layout ``_apply_block`` reads:
    ``{"saved_at": t, "gone_gpus": [uuid], "gone_procs": [[uuid, pid]], "gpus": [[uuid, drop, points]],
    "procs": [[uuid, pid, drop, points]]}``; ``drop`` null replaces the ring."""

    def __init__(self, now: float, gone_gpus: Sequence[str] = (), gone_procs: Sequence[tuple[str, int]] = ()) -> None:
        self._z = zlib.compressobj(LEVEL)
        self._out: list[bytes] = []
        self._procs = False
        self._first = True
        self.expires = -math.inf
        self._now = now
        self._put(f'{{"saved_at":{_DUMPS(now)},"gone_gpus":{_DUMPS(list(gone_gpus))},'
                  f'"gone_procs":{_DUMPS([[u, pid] for u, pid in gone_procs])},"gpus":[')

    def _put(self, text: str) -> None:
        out = self._z.compress(text.encode())
        if out:
            self._out.append(out)

    def add(self, procs: bool, row: list[Any], newest: float) -> None:
        if procs and not self._procs:
            self._put('],"procs":[')
            self._procs, self._first = True, True
        self._put(_DUMPS(row) if self._first else "," + _DUMPS(row))
        self._first = False
        self.expires = max(self.expires, newest)

    def finish(self) -> Block:
        self._put(']}' if self._procs else '],"procs":[]}')
        self._out.append(self._z.flush())
        payload = b"".join(self._out)
        self._out = []
        expires = self.expires if self.expires > -math.inf else self._now
        return Block(FRAME.pack(len(payload), zlib.crc32(payload)), payload, expires)


def _newest(pts: Sequence[GpuPoint] | Sequence[ProcessPoint]) -> float:
    return max(p.t for p in pts) if pts else -math.inf


def encode_delta(delta: Delta, now: float) -> Block:
    """One save's changes as one block (the steady save: O(what changed)), in the layout ``_BlockWriter`` writes;
    one document, encoded at once (a minute of points is small)."""
    doc = {
        "saved_at": now,
        "gone_gpus": delta.gone_gpus,
        "gone_procs": [[u, pid] for u, pid in delta.gone_procs],
        "gpus": [[g.key, g.drop, gpu_rows(g.points)] for g in delta.gpus],
        "procs": [[p.key[0], p.key[1], p.drop, proc_rows(p.points)] for p in delta.procs],
    }
    payload = zlib.compress(_DUMPS(doc).encode(), LEVEL)
    newest = max((*(_newest(g.points) for g in delta.gpus), *(_newest(p.points) for p in delta.procs)),
                 default=-math.inf)
    return Block(FRAME.pack(len(payload), zlib.crc32(payload)), payload, newest if newest > -math.inf else now)


def _runs(ts: list[float], width: float) -> list[tuple[int, int, int]]:
    """(slice, start, end) of the consecutive points of a ring in the same time slice of ``width`` seconds; one
    run in the slice of its newest point when its times are not in order (a clock that went back), so the ring's
    order survives."""
    if any(a > b for a, b in itertools.pairwise(ts)):
        return [(math.floor(max(ts) / width), 0, len(ts))] if ts else []
    runs: list[tuple[int, int, int]] = []
    start = 0
    while start < len(ts):
        s = math.floor(ts[start] / width)
        end = start + 1
        limit = (s + 1) * width
        while end < len(ts) and ts[end] < limit:
            end += 1
        runs.append((s, start, end))
        start = end
    return runs


def encode_full(delta: Delta, now: float, width: float) -> list[Block]:
    """Every ring whole (``delta.full``), for a file written afresh: cut into blocks of ``width`` seconds of points
    each, oldest first (a ring's first run replaces it, the others append), so the oldest blocks age out whole."""
    writers: dict[int, _BlockWriter] = {}

    def writer(s: int) -> _BlockWriter:
        w = writers.get(s)
        if w is None:
            w = writers[s] = _BlockWriter(now)
        return w

    for g in delta.gpus:
        rows = gpu_rows(g.points)
        for i, (s, a, b) in enumerate(_runs([r[0] for r in rows], width)):
            writer(s).add(False, [g.key, None if i == 0 else 0, rows[a:b]], max(r[0] for r in rows[a:b]))
    for p in delta.procs:
        prows = proc_rows(p.points)
        for i, (s, a, b) in enumerate(_runs([r[0] for r in prows], width)):
            writer(s).add(True, [p.key[0], p.key[1], None if i == 0 else 0, prows[a:b]],
                          max(r[0] for r in prows[a:b]))
    if not writers:
        return [_BlockWriter(now).finish()]  # no history: still a file that loads
    return [writers[s].finish() for s in sorted(writers)]


def _num(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise HistoryError(f"{what}: not a finite number")
    return float(x)


_MAX_BYTE_COUNT = 2**63


def _bytes(x: Any, what: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < _MAX_BYTE_COUNT:
        raise HistoryError(f"{what}: not a byte count")
    return x


def _list(x: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(x, list):
        raise HistoryError(f"{what}: not a list")
    if len(x) > limit:
        raise HistoryError(f"{what}: {len(x)} entries, more than {limit}")
    return x


_DECODE = msgspec.json.Decoder().decode


def _inflate(data: bytes, limit: int) -> Any:
    """One zlib stream of JSON, at most ``limit`` bytes once decompressed, nothing after it."""
    try:
        z = zlib.decompressobj()
        raw = z.decompress(data, limit + 1)  # (a max_length of 0 is no limit)
        if z.unconsumed_tail or len(raw) > limit:
            raise HistoryError(f"more than {MAX_BYTES} bytes decompressed")
        if not z.eof:
            raise HistoryError("truncated")
        if z.unused_data:
            raise HistoryError("data after the end of a compressed document")
        # msgspec's decoder (the config's library): ~3x json.loads on the 100+ MB an hour of 16 x 256 holds
        return len(raw), _DECODE(raw)
    except (zlib.error, ValueError, RecursionError, msgspec.MsgspecError) as e:
        if isinstance(e, HistoryError):
            raise
        raise HistoryError(f"not a history file ({type(e).__name__})") from None


def _gpu_points(items: Any, what: str) -> list[GpuPoint]:
    out = []
    for item in _list(items, what, MAX_POINTS):
        row = _list(item, "gpu point", 4)
        if len(row) != 4:
            raise HistoryError("gpu point: 4 fields expected")
        out.append(GpuPoint(_num(row[0], "t"), _bytes(row[1], "used"), _bytes(row[2], "total"),
                            _bytes(row[3], "attributed"), None, None, None, None, {}, None, None, None))
    return out


def _proc_points(items: Any, what: str) -> list[ProcessPoint]:
    """The points of one process ring, each checked; the loop a restart runs ~3 M times at 16 x 256 with an hour
    of history: plain rows are checked inline and built through the store's slot setters, and any row that is not
    one sends the whole list to the checks that say what is wrong with it."""
    rows = _list(items, what, MAX_POINTS)
    out: list[ProcessPoint] = []
    append = out.append
    for row in rows:
        if type(row) is not list or len(row) != 3:
            return _proc_points_checked(rows)
        t, used, rss = row
        if type(t) is not float or t - t != 0.0 \
                or not (used is None or (type(used) is int and 0 <= used < _MAX_BYTE_COUNT)) \
                or not (rss is None or (type(rss) is int and 0 <= rss < _MAX_BYTE_COUNT)):
            return _proc_points_checked(rows)  # an int time, a bool, a float count, out of range, not finite ...
        append(_proc_point(t, used, rss))
    return out


def _proc_points_checked(items: list[Any]) -> list[ProcessPoint]:
    out = []
    for item in items:
        row = _list(item, "process point", 3)
        if len(row) != 3:
            raise HistoryError("process point: 3 fields expected")
        out.append(ProcessPoint(_num(row[0], "t"), _bytes(row[1], "used"), _bytes(row[2], "rss")))
    return out


def _pid(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise HistoryError("process: pid not an integer")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise HistoryError(f"{what}: not a string")
    return x


def decode(data: bytes) -> History:
    """Parse and validate a history file's bytes (version 2, or 1); any defect raises HistoryError, but a version 2
    file whose last blocks are cut short or damaged loads the blocks before them (``History.torn`` says so)."""
    if data.startswith(MAGIC):
        return _decode_log(data)
    _, doc = _inflate(data, MAX_BYTES)
    if not isinstance(doc, dict) or doc.get("v") != V1:
        raise HistoryError(f"not version {V1} or {VERSION}")
    hist = History(_num(doc.get("saved_at"), "saved_at"))
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict) or len(gpus) > MAX_SERIES:
        raise HistoryError("gpus: not a bounded mapping")
    for uuid, pts in gpus.items():
        hist.gpus[uuid] = _gpu_points(pts, f"gpu {uuid[:64]}")
    for raw_entry in _list(doc.get("procs"), "procs", MAX_SERIES):
        entry = _list(raw_entry, "process", 3)
        if len(entry) != 3 or not isinstance(entry[0], str) or isinstance(entry[1], bool) \
                or not isinstance(entry[1], int):
            raise HistoryError("process: [uuid, pid, points] expected")
        hist.procs[(entry[0], entry[1])] = _proc_points(entry[2], f"process {entry[1]}")
    return hist


def _decode_log(data: bytes) -> History:
    pos, end = len(MAGIC), len(data)
    budget = MAX_BYTES
    hist: History | None = None
    blocks = 0
    while pos < end:
        if end - pos < FRAME.size:
            torn = f"{end - pos} bytes at the end, shorter than a block header"
            break
        length, crc = FRAME.unpack_from(data, pos)
        payload = data[pos + FRAME.size:pos + FRAME.size + length]
        if len(payload) < length:
            torn = f"the last block, {end - pos} of its {FRAME.size + length} bytes written"
            break
        if zlib.crc32(payload) != crc or not length:  # (no block is empty: a crash can leave zeros at the end)
            torn = f"a damaged block at byte {pos} and the {end - pos} bytes from there"
            break
        blocks += 1
        if blocks > MAX_BLOCKS:
            raise HistoryError(f"more than {MAX_BLOCKS} blocks")
        used, doc = _inflate(payload, budget)
        budget -= used
        hist, newest = _apply_block(hist, doc)
        if hist.blocks is None:
            hist.blocks = []
        hist.blocks.append((FRAME.size + length, newest))
        pos += FRAME.size + length
    else:
        torn = None
    if hist is None:
        raise HistoryError("no complete block" if end > len(MAGIC) else "no block")
    hist.torn = torn
    return hist


def _drop(x: Any) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise HistoryError("drop: not a count")
    return x


def _apply_block(hist: History | None, doc: Any) -> tuple[History, float]:
    """Replay one block on the history so far (``_BlockWriter`` describes the layout); with the block's expiry as
    the writer set it (its newest point's time, the save's if it has none)."""
    if not isinstance(doc, dict):
        raise HistoryError("block: not a mapping")
    saved_at = _num(doc.get("saved_at"), "saved_at")
    if hist is None:
        hist = History(saved_at)
    hist.saved_at = saved_at
    gpus, procs = hist.gpus, hist.procs
    newest = -math.inf
    for u in _list(doc.get("gone_gpus"), "gone_gpus", MAX_SERIES):
        gpus.pop(_str(u, "gone gpu"), None)
    for item in _list(doc.get("gone_procs"), "gone_procs", MAX_SERIES):
        gone = _list(item, "gone process", 2)
        if len(gone) != 2:
            raise HistoryError("gone process: [uuid, pid] expected")
        procs.pop((_str(gone[0], "gone process"), _pid(gone[1])), None)
    for raw in _list(doc.get("gpus"), "gpus", MAX_SERIES):
        entry = _list(raw, "gpu", 3)
        if len(entry) != 3:
            raise HistoryError("gpu: [uuid, drop, points] expected")
        uuid = _str(entry[0], "gpu")
        gpts = _gpu_points(entry[2], f"gpu {uuid[:64]}")
        newest = max(newest, _newest(gpts))
        _splice(gpus, uuid, _drop(entry[1]), gpts)
    for raw in _list(doc.get("procs"), "procs", MAX_SERIES):
        pentry = _list(raw, "process", 4)
        if len(pentry) != 4:
            raise HistoryError("process: [uuid, pid, drop, points] expected")
        key = (_str(pentry[0], "process"), _pid(pentry[1]))
        ppts = _proc_points(pentry[3], f"process {key[1]}")
        newest = max(newest, _newest(ppts))
        _splice(procs, key, _drop(pentry[2]), ppts)
    if len(gpus) > MAX_SERIES or len(procs) > MAX_SERIES:
        raise HistoryError(f"more than {MAX_SERIES} series")
    return hist, newest if newest > -math.inf else saved_at


def _splice(rings: dict[Any, list[Any]], key: Any, drop: int | None, points: list[Any]) -> None:
    """Drop the ring's newest ``drop`` points and append ``points``; ``drop`` None replaces the ring. A ring whose
    older blocks were cut off (they aged out) has fewer points than ``drop``: what is there goes."""
    ring = rings.get(key)
    if ring is None or drop is None:
        rings[key] = points
        return
    if drop:
        del ring[max(0, len(ring) - drop):]
    ring.extend(points)
    if len(ring) > MAX_POINTS:
        raise HistoryError(f"more than {MAX_POINTS} points in a series")


def restore(store: Store, hist: History, now: float) -> int:
    """Seed ``store`` with the points of ``hist`` within its retention and not after ``now``; returns how many
    series were restored."""
    lo = now - store.retention_seconds

    def keep(pts: Sequence[GpuPoint] | Sequence[ProcessPoint]) -> bool:
        return bool(pts)

    gpus: Mapping[str, list[GpuPoint]] = {
        u: sorted((p for p in pts if lo <= p.t <= now), key=lambda p: p.t) for u, pts in hist.gpus.items()
    }
    procs: Mapping[tuple[str, int], list[ProcessPoint]] = {
        k: sorted((p for p in pts if lo <= p.t <= now), key=lambda p: p.t) for k, pts in hist.procs.items()
    }
    gpus = {u: pts for u, pts in gpus.items() if keep(pts)}
    procs = {k: pts for k, pts in procs.items() if keep(pts)}
    store.restore_history(gpus, procs)
    return len(gpus) + len(procs)


def prune(store: Store, snap: Snapshot) -> int:
    """Drop restored history of GPUs and processes the first snapshot after a restart does not list."""
    return store.keep_history(
        (g.uuid for g in snap.gpus), ((g.uuid, p.pid) for g in snap.gpus for p in g.processes)
    )


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Temporary file, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        for part in [data] if isinstance(data, bytes) else data:
            f.write(part)
        f.flush()
        os.fsync(f.fileno())
    rename_synced(tmp, path)


def rename_synced(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` (written and fsynced) over ``path`` and fsync the directory."""
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
