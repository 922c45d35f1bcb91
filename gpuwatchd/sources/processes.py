"""GPU processes: merge NVML's compute and graphics lists, keep the top N by GPU memory, add host facts.

NVML knows pids and GPU memory only; name, user and host RSS come from psutil (:class:`PsutilResolver`) or any
other :class:`Resolver` the worker is given (under the stand-in driver the pids are fictitious, so
``gpuwatchd.sim.resolver`` reads them from the sim state). It runs inside the NVML worker process, once per poll,
for the kept processes only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

# Fallback when /proc/sys/kernel/pid_max is unreadable: the kernel's PID_MAX_LIMIT on 64-bit (2^22).
DEFAULT_PID_MAX = 4_194_304

# (name, user, host RSS bytes); any part may be unknown.
ProcInfo = tuple[str | None, str | None, int | None]
UNKNOWN: ProcInfo = (None, None, None)
# A pid NVML reports that is not in our /proc (another pid namespace, the stand-in's fictitious pids) is looked
# up again only after this long: a failed psutil lookup per process per poll was ~20 us each (bench/footprint.py).
MISSING_RECHECK_SECONDS = 60.0


def pid_max(proc_root: Path = Path("/proc")) -> int:
    """The kernel's pid limit; a larger "pid" is a scrambled struct, not a process (nvitop#75)."""
    try:
        return int((proc_root / "sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        return DEFAULT_PID_MAX


class Resolver(Protocol):
    """Host facts for pids; unknown pids map to :data:`UNKNOWN` (e.g. a pid from another pid namespace)."""

    def resolve(self, pids: Sequence[int]) -> dict[int, ProcInfo]: ...


def merge_processes(
    compute: Iterable[tuple[int, int | None]],
    graphics: Iterable[tuple[int, int | None]],
    limit: int = DEFAULT_PID_MAX,
) -> dict[int, list[Any]]:
    """pid -> [kind, used bytes]: one entry per valid pid (None = unattributed).

    A process with both compute and graphics contexts (nvidia-smi type ``C+G``) is in both lists, each time with
    its whole GPU memory: nvml.h documents usedGpuMemory of the process calls as "all of the memory used by the
    application". So the two values are one quantity read twice, not two parts: the entry keeps the larger (the
    two calls are moments apart; the larger is the one that saw the most recent allocation), and reports the
    process as ``compute`` -- it holds a CUDA context, which is what the leak rule and the exported kind are about.
    Pids <= 0 or above ``limit`` are dropped: they come from a struct-layout mismatch, not from a process.
    """
    merged: dict[int, list[Any]] = {}
    for kind, procs in (("compute", compute), ("graphics", graphics)):
        for pid, mem in procs:
            if pid <= 0 or pid > limit:
                continue
            entry = merged.get(pid)
            if entry is None:
                merged[pid] = [kind, mem]
            elif mem is not None and (entry[1] is None or mem > entry[1]):
                entry[1] = mem
    return merged


def top_processes(merged: Mapping[int, list[Any]], n: int) -> list[tuple[int, str, int | None]]:
    """The ``n`` processes using the most GPU memory (unattributed last, then by pid for a stable order)."""
    if n <= 0:
        return []
    # Runs per GPU per poll: sorting plain key tuples (compared in C) is ~2x faster than a key function, and
    # faster than heapq.nsmallest, whose loop is Python (measured at 32 and 256 processes, top 10).
    keys = [(e[1] is None, -(e[1] or 0), pid) for pid, e in merged.items()]
    keys.sort()
    return [(pid, merged[pid][0], merged[pid][1]) for _, _, pid in keys[:n]]


def process_dicts(
    top: Sequence[tuple[int, str, int | None]], resolver: Resolver | None
) -> list[dict[str, Any]]:
    """The pipe encoding of ``ProcessSample`` for the kept processes, with host facts where known."""
    infos = resolver.resolve([t[0] for t in top]) if resolver is not None and top else {}
    return _dicts(top, infos)


def process_dicts_per_gpu(
    tops: Sequence[Sequence[tuple[int, str, int | None]]], resolver: Resolver | None
) -> list[list[dict[str, Any]]]:
    """:func:`process_dicts` for every GPU of a poll with ONE resolve call: a resolver's cache is bounded by the
    pids of its last call, so one call per GPU would evict the other GPUs' entries and look every process up
    again on every poll."""
    pids = [t[0] for top in tops for t in top]
    infos = resolver.resolve(pids) if resolver is not None and pids else {}
    return [_dicts(top, infos) for top in tops]


def _dicts(top: Sequence[tuple[int, str, int | None]], infos: Mapping[int, ProcInfo]) -> list[dict[str, Any]]:
    get = infos.get
    out = []
    for pid, kind, mem in top:
        name, user, rss = get(pid, UNKNOWN)
        out.append(
            {"pid": pid, "kind": kind, "used_memory_bytes": mem, "name": name, "user": user, "host_rss_bytes": rss}
        )
    return out


class PsutilResolver:
    """Name, user and RSS of host processes; caches per (pid, create_time) so a reused pid is not mistaken.

    A pid with no process here is remembered as missing (negative cache) and looked up again only after
    ``recheck`` seconds; both caches are bounded by the pids of the last call."""

    def __init__(self, recheck: float = MISSING_RECHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cache: dict[int, tuple[psutil.Process, str | None, str | None]] = {}
        self._missing: dict[int, float] = {}  # pid -> when to look it up again
        self._recheck = recheck
        self._clock = clock
        self.lookups = 0  # psutil.Process constructions (tests check the negative cache)

    def _entry(self, pid: int) -> tuple[psutil.Process, str | None, str | None] | None:
        cached = self._cache.get(pid)
        if cached is not None and cached[0].is_running():  # is_running compares create_time: pid reuse safe
            return cached
        retry = self._missing.get(pid)
        if retry is not None and self._clock() < retry:
            return None
        self.lookups += 1
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._cache.pop(pid, None)
            self._missing[pid] = self._clock() + self._recheck
            return None
        except psutil.AccessDenied:
            self._cache.pop(pid, None)
            return None
        self._missing.pop(pid, None)
        name: str | None
        user: str | None
        try:
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            name = None
        try:
            user = proc.username()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, KeyError):
            user = None  # KeyError: uid without a passwd entry (containers)
        entry = (proc, name, user)
        self._cache[pid] = entry
        return entry

    def resolve(self, pids: Sequence[int]) -> dict[int, ProcInfo]:
        out: dict[int, ProcInfo] = {}
        for pid in pids:
            entry = self._entry(pid)
            if entry is None:
                out[pid] = UNKNOWN
                continue
            proc, name, user = entry
            try:
                rss: int | None = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                rss = None
            out[pid] = (name, user, rss)
        wanted = set(pids)
        for gone in [p for p in self._cache if p not in wanted]:
            del self._cache[gone]  # keep the cache bounded by the current top-N set
        for gone in [p for p in self._missing if p not in wanted]:
            del self._missing[gone]
        return out
