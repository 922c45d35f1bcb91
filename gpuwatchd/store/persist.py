"""Rule history that survives a restart: the store's history rings, saved to ``<state_dir>/rule-history.z``.

Without it a daemon restarted in the middle of a job (upgrade, reload, crash) misses the job's start: the leak
rule could not tell a saturating job seen from its middle from a leak, and a leak's onset was lost.

- Compact: only what the leak rule reads (GPU memory used/total/attributed; per process GPU memory and host
  RSS), as JSON arrays, zlib-compressed; bounded by the rings themselves (``history.retention`` / ``step``) and,
  on load, by ``MAX_SERIES`` / ``MAX_POINTS`` / ``MAX_BYTES`` whatever the file says.
- Off the event loop: the loop copies the rings (tuples of immutable points, no encoding), a thread encodes and
  writes a temporary file, fsyncs and renames it over the old one (atomic: a crash leaves the old or the new).
- Loaded at start; points older than the retention or from the future are dropped, and at the first snapshot the
  history of GPUs and processes that no longer exist is dropped (``prune``), so a reused pid starts afresh.
- A corrupt or hostile file: start with empty history, one log line, ``gpuwatchd_rule_history_load_errors_total``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatchd.model import Snapshot
from gpuwatchd.store import GpuPoint, ProcessPoint, Store

log = logging.getLogger(__name__)

FILE_NAME = "rule-history.z"
VERSION = 1
MAX_SERIES = 8192  # 64 GPUs x 128 processes
MAX_POINTS = 100_000  # per series; the rings hold retention/step + 2 (722 by default)
MAX_BYTES = 256 * 1024 * 1024  # decompressed; a zip bomb stops here


class HistoryError(ValueError):
    """The history file cannot be used (corrupt, truncated, hostile, another version)."""


@dataclass
class History:
    saved_at: float
    gpus: dict[str, list[GpuPoint]] = field(default_factory=dict)
    procs: dict[tuple[str, int], list[ProcessPoint]] = field(default_factory=dict)


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
    yield f'{{"v":{VERSION},"saved_at":{json.dumps(now)},"gpus":{{'
    for i, (u, pts) in enumerate(gpus.items()):
        body = [[p.t, p.memory_used_bytes, p.memory_total_bytes, p.processes_memory_bytes] for p in pts]
        yield ("," if i else "") + json.dumps(u) + ":" + json.dumps(body, separators=(",", ":"))
    yield '},"procs":['
    for i, ((u, pid), ppts) in enumerate(procs.items()):
        row = [u, pid, [[p.t, p.used_memory_bytes, p.host_rss_bytes] for p in ppts]]
        yield ("," if i else "") + json.dumps(row, separators=(",", ":"))
    yield "]}"


def encode_rings(rings: Rings, now: float) -> bytes:
    z = zlib.compressobj(6)
    out = [z.compress(chunk.encode()) for chunk in _chunks(rings, now)]
    out.append(z.flush())
    return b"".join(out)


def encode(store: Store, now: float) -> bytes:
    return encode_rings(copy_rings(store), now)


def _num(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise HistoryError(f"{what}: not a finite number")
    return float(x)


def _bytes(x: Any, what: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
        raise HistoryError(f"{what}: not a byte count")
    return x


def _list(x: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(x, list):
        raise HistoryError(f"{what}: not a list")
    if len(x) > limit:
        raise HistoryError(f"{what}: {len(x)} entries, more than {limit}")
    return x


def decode(data: bytes) -> History:
    """Parse and validate a history file's bytes; any defect raises HistoryError."""
    try:
        z = zlib.decompressobj()
        raw = z.decompress(data, MAX_BYTES)
        if z.unconsumed_tail:
            raise HistoryError(f"more than {MAX_BYTES} bytes decompressed")
        if not z.eof:
            raise HistoryError("truncated")
        doc = json.loads(raw)
    except (zlib.error, ValueError, RecursionError) as e:
        if isinstance(e, HistoryError):
            raise
        raise HistoryError(f"not a history file ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        raise HistoryError(f"not version {VERSION}")
    hist = History(_num(doc.get("saved_at"), "saved_at"))
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict) or len(gpus) > MAX_SERIES:
        raise HistoryError("gpus: not a bounded mapping")
    for uuid, pts in gpus.items():
        out = hist.gpus[uuid] = []
        for item in _list(pts, f"gpu {uuid[:64]}", MAX_POINTS):
            row = _list(item, "gpu point", 4)
            if len(row) != 4:
                raise HistoryError("gpu point: 4 fields expected")
            out.append(GpuPoint(_num(row[0], "t"), _bytes(row[1], "used"), _bytes(row[2], "total"),
                                _bytes(row[3], "attributed"), None, None, None, None, {}, None, None, None))
    for raw_entry in _list(doc.get("procs"), "procs", MAX_SERIES):
        entry = _list(raw_entry, "process", 3)
        if len(entry) != 3 or not isinstance(entry[0], str) or isinstance(entry[1], bool) \
                or not isinstance(entry[1], int):
            raise HistoryError("process: [uuid, pid, points] expected")
        pout = hist.procs[(entry[0], entry[1])] = []
        for item in _list(entry[2], f"process {entry[1]}", MAX_POINTS):
            row = _list(item, "process point", 3)
            if len(row) != 3:
                raise HistoryError("process point: 3 fields expected")
            pout.append(ProcessPoint(_num(row[0], "t"), _bytes(row[1], "used"), _bytes(row[2], "rss")))
    return hist


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


def write_atomic(path: Path, data: bytes) -> None:
    """Temporary file, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
