"""GPU processes: merge NVML's compute and graphics lists, keep the top N by GPU memory, add host facts.

NVML knows pids and GPU memory only; name, user and host RSS come from psutil (:class:`ProcResolver`) or any
other :class:`Resolver` the worker is given (under the stand-in driver the pids are fictitious, so
``gpuwatchd.sim.resolver`` reads them from the sim state). It runs inside the NVML worker process, once per poll,
for the kept processes only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import psutil

from gpuwatchd.sources.nvml.worker.proc_dirs import ProcDirs

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, Protocol

# Fallback when /proc/sys/kernel/pid_max is unreadable: the kernel's PID_MAX_LIMIT on 64-bit (2^22).
DEFAULT_PID_MAX = 4_194_304

# (name, user, host RSS bytes); any part may be unknown.
ProcInfo = tuple[str | None, str | None, int | None]
UNKNOWN: ProcInfo = (None, None, None)
# A pid NVML reports that is not in our /proc (another pid namespace, the stand-in's fictitious pids) is looked
# up again only after this long: a failed lookup per process per poll was ~20 us each (bench/footprint.py).
MISSING_RECHECK_SECONDS = 60.0
# Kept processes read per poll at most (~3 us each, most of it the kernel's): with more reported (16 GPUs x
# ``top_n`` 256 is 4,096), each is read every ceil(n / READS_PER_POLL) polls, at 1 s polling within the 5 s step
# of the rule history; a host with fewer GPU processes kept has every one read at every poll.
READS_PER_POLL = 1024
_NONE_KEPT: frozenset[int] = frozenset()
MAX_NAME_CHARS = 255  # NAME_MAX: argv[0] can be 128 KiB; its base name becomes a label value


# /proc paths are plain strings here: pathlib (with urllib.parse and ipaddress) is 0.5 MB the worker need not load.
ProcRoot = str | os.PathLike[str]


def pid_max(proc_root: ProcRoot = "/proc") -> int:
    """The kernel's pid limit; a larger "pid" is a scrambled struct, not a process (nvitop#75)."""
    try:
        with open(os.path.join(proc_root, "sys/kernel/pid_max")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_PID_MAX


if TYPE_CHECKING:  # a type only: the worker is handed any object with this method
    class Resolver(Protocol):
        """Host facts for pids; unknown pids map to :data:`UNKNOWN` (e.g. a pid from another pid namespace)."""

        def resolve(self, pids: Sequence[int]) -> dict[int, ProcInfo]: ...


# Whether a pid NVML reports still has a process (docs/alerts.md, GpuMemoryHeldByDeadProcess):
# LIVE, ZOMBIE (exited, its parent has not reaped it), GONE (no such pid, and our /proc is the host's pid
# namespace, where NVML's pids live), HIDDEN (no such pid here, but we run in another pid namespace: a process
# outside it is invisible, not dead).
LIVE, ZOMBIE, GONE, HIDDEN = "live", "zombie", "gone", "hidden"
# (state, seconds since it was first seen not live, or None while live)
HostState = tuple[str | None, float | None]
# The inode of the initial (host) pid namespace: a fixed constant of the kernel (PROC_PID_INIT_INO = 0xEFFFFFFC,
# include/linux/proc_ns.h), so ``readlink /proc/self/ns/pid`` is ``pid:[4026531836]`` exactly when we run in it
# (on the host, or in a container started with --pid=host / hostPID: true).
HOST_PID_NAMESPACE = f"pid:[{0xEFFFFFFC}]"


def in_host_pid_namespace(proc_root: ProcRoot = "/proc") -> bool:
    """True when this process runs in the host's pid namespace, the one NVML reports pids in. Unreadable (no
    /proc, a sandbox hiding ns/): False, so that a missing pid is never called dead on no evidence."""
    try:
        return os.readlink(os.path.join(proc_root, "self/ns/pid")) == HOST_PID_NAMESPACE
    except OSError:
        return False


if TYPE_CHECKING:
    class StateResolver(Protocol):
        """A resolver that can also tell whether each pid still has a process (:data:`HostState` per pid)."""

        def states(self, pids: Sequence[int]) -> dict[int, HostState]: ...


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
    return process_dicts_per_gpu([top], resolver)[0]


def process_dicts_per_gpu(
    tops: Sequence[Sequence[tuple[int, str, int | None]]], resolver: Resolver | None
) -> list[list[dict[str, Any]]]:
    """:func:`process_dicts` for every GPU of a poll with ONE resolve call: a resolver's cache is bounded by the
    pids of its last call, so one call per GPU would evict the other GPUs' entries and look every process up
    again on every poll."""
    pids = [t[0] for top in tops for t in top]
    infos = resolver.resolve(pids) if resolver is not None and pids else {}
    states_of = getattr(resolver, "states", None)
    states: Mapping[int, HostState] = states_of(pids) if states_of is not None and pids else {}
    return [_dicts(top, infos, states) for top in tops]


_NO_STATE: HostState = (None, None)
_LIVE: HostState = (LIVE, None)


def _dicts(top: Sequence[tuple[int, str, int | None]], infos: Mapping[int, ProcInfo],
           states: Mapping[int, HostState]) -> list[dict[str, Any]]:
    get = infos.get
    out = []
    for pid, kind, mem in top:
        name, user, rss = get(pid, UNKNOWN)
        state, since = states.get(pid, _NO_STATE)
        out.append(
            {"pid": pid, "kind": kind, "used_memory_bytes": mem, "name": name, "user": user, "host_rss_bytes": rss,
             "host_state": state, "host_state_seconds": since}
        )
    return out


class ProcResolver:
    """Name, user and RSS of host processes, from psutil; cached per process (psutil's pid and start time), so a
    reused pid is not mistaken for the process it replaced.

    A pid with no process here is remembered as missing (negative cache) and looked up again only after
    ``recheck`` seconds; both caches are bounded by the pids of the last call. Each poll, per kept process: its
    RSS from ``statm`` in a kept ``/proc/PID`` directory descriptor where it has one (a read that answers is the
    same process: the open fails once its process is reaped, and only then can the pid be reused), else through
    psutil, with psutil's pid-reuse check (a fresh :class:`psutil.Process` compared with the cached one, as
    :meth:`psutil.Process.is_running` does: the start time read again; the cached ``create_time()`` cannot tell), a
    changed one being a new process whose name and user are read again; and its status (zombie) only when the RSS is
    0 (:meth:`_read`). :meth:`close` releases the descriptors.

    ``proc_root`` other than ``/proc`` (tests with a written tree) sets ``psutil.PROCFS_PATH``, which is
    process-global: every psutil call of this process reads that tree from then on. The worker has one resolver
    and reads the host's ``/proc``."""

    def __init__(self, recheck: float = MISSING_RECHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic, *, host_namespace: bool | None = None,
                 proc_root: ProcRoot = "/proc") -> None:
        # pid -> [psutil.Process, name, user, zombie at the last read, RSS at the last read, the facts resolved last]
        self._cache: dict[int, list[Any]] = {}
        self._missing: dict[int, float] = {}  # pid -> when to look it up again
        self._recheck = recheck
        self._clock = clock
        root = os.fspath(proc_root)
        # A kept descriptor names its process only in a real procfs: not in a written /proc tree (tests)
        self._handles: ProcDirs | None = None
        if os.path.normpath(root) != "/proc":
            psutil.PROCFS_PATH = root
        else:
            self._handles = ProcDirs()
        # Decided once: a worker does not change pid namespace. None: look at /proc/self/ns/pid.
        self.host_namespace = in_host_pid_namespace(proc_root) if host_namespace is None else host_namespace
        self._since: dict[int, float] = {}  # pid -> clock() when first seen not live
        self.lookups = 0  # psutil.Process constructions for a pid not cached (tests check the negative cache)
        self._calls = 0  # resolve() calls: whose turn it is when the kept processes are more than a poll reads

    def _read(self, pid: int) -> tuple[list[Any], int | None] | None:
        """The cache entry of ``pid`` (a new one when the pid is new or was reused) with its zombie flag refreshed,
        and its RSS; None when unknown.

        A process with a kept ``/proc/PID`` descriptor (:mod:`~gpuwatchd.sources.nvml.worker.proc_dirs`) whose
        ``statm`` reads is the cached one (a reaped process' directory fails, and its pid is reused only after that):
        one ``openat`` and read. Any other known pid takes two reads through psutil: a fresh ``psutil.Process`` (its
        start time, from ``stat``; equal to the cached one exactly when the pid was not reused: psutil's own
        ``is_running`` check) and ``memory_info``. The status is read only for an RSS of 0: a zombie has released its
        memory (``exit_mm`` comes before the exit notification), so every zombie reads 0, and a process holding any
        page is no zombie. It was three reads per pid (``is_running``, then ``status`` and ``memory_info`` in a
        ``oneshot``): ~30 us per pid, then ~7 with pidfds, ~2 with the directory (docs/performance.md)."""
        cached = self._cache.get(pid)
        handles = self._handles
        rss: int | None
        if cached is not None and handles is not None:
            rss = handles.rss(pid)
            if rss is not None:  # still the cached process
                if rss:
                    cached[3] = False
                else:
                    try:
                        cached[3] = cached[0].status() == psutil.STATUS_ZOMBIE
                    except psutil.ZombieProcess:
                        cached[3] = True
                    except psutil.Error:  # reaped meanwhile: the next read of its descriptor fails
                        pass
                cached[4] = rss
                return cached, rss
        if cached is None:
            retry = self._missing.get(pid)
            if retry is not None and self._clock() < retry:
                return None
            self.lookups += 1
        try:
            proc = psutil.Process(pid)
            if cached is None or cached[0] != proc:  # new, or its pid reused: another start time
                self._missing.pop(pid, None)
                if handles is not None:
                    handles.forget(pid)
                with proc.oneshot():
                    cached = self._cache[pid] = [proc, _name(proc), _user(proc), False, None, UNKNOWN]
            try:
                rss = proc.memory_info().rss
                cached[3] = rss == 0 and proc.status() == psutil.STATUS_ZOMBIE
            except psutil.ZombieProcess:
                cached[3], rss = True, None
        except psutil.NoSuchProcess:  # no such pid (any more): missing, looked up again after the recheck
            self._drop(pid)
            self._missing[pid] = self._clock() + self._recheck
            return None
        except psutil.AccessDenied:  # alive, but we may not say more
            self._drop(pid)
            return None
        if handles is not None and pid not in handles and handles.open(pid):
            # The pid may have changed hands between the read above and the open: keep only the process read.
            try:
                same = psutil.Process(pid) == proc
            except psutil.Error:
                same = False
            if not same:
                handles.forget(pid)
        cached[4] = rss
        return cached, rss

    def _drop(self, pid: int) -> None:
        self._cache.pop(pid, None)
        if self._handles is not None:
            self._handles.forget(pid)

    def resolve(self, pids: Sequence[int]) -> dict[int, ProcInfo]:
        """Host facts of ``pids`` (those not known: :data:`UNKNOWN`).

        Kept processes are read through their descriptors in one pass; when more than :data:`READS_PER_POLL` are
        reported, a kept process is read at every ``rounds``-th call only (``rounds`` = the pids / the budget,
        rounded up; by ``pid % rounds``, so each is read at a fixed turn and the reads spread over the calls) and
        keeps its last facts between (docs/performance.md, "16x256 on a live fleet")."""
        out: dict[int, ProcInfo] = {}
        cache = self._cache
        handles = self._handles
        self._calls += 1
        rounds = -(-len(pids) // READS_PER_POLL)
        turn = self._calls % rounds if rounds else 0
        if handles is not None and len(handles):
            fresh = handles.rss_of(pids if rounds <= 1 else [p for p in pids if p % rounds == turn])
        else:
            fresh = {}
        kept = handles.kept() if handles is not None and rounds > 1 else _NONE_KEPT
        for pid in pids:
            if pid in kept and pid % rounds != turn:  # not its turn: the facts of its last turn
                out[pid] = cache[pid][5]
                continue
            rss = fresh.get(pid)
            if rss:  # the kept process, alive (a zombie reads 0: _read looks at its status)
                entry = cache[pid]
                entry[3] = False
                entry[4] = rss
                out[pid] = entry[5] = (entry[1], entry[2], rss)
                continue
            got = self._read(pid)
            if got is None:
                out[pid] = UNKNOWN
                continue
            entry, rss = got
            out[pid] = entry[5] = (entry[1], entry[2], rss)
        wanted = set(pids)
        for gone in [p for p in self._cache if p not in wanted]:
            self._drop(gone)  # keep the cache bounded by the current top-N set
        for gone in [p for p in self._missing if p not in wanted]:
            del self._missing[gone]
        return out

    def close(self) -> None:
        """Release the kept descriptors (the cache stays usable: every pid is read through psutil from then on)."""
        if self._handles is not None:
            self._handles.close()
            self._handles = None

    def states(self, pids: Sequence[int]) -> dict[int, HostState]:
        """Whether each pid still has a process here: a missing one is GONE in the host's pid namespace and
        HIDDEN in any other; a zombie is ZOMBIE. Uses what :meth:`resolve` read in the same poll (call it first)."""
        out: dict[int, HostState] = {}
        now = self._clock()
        since = self._since
        for pid in pids:
            cached = self._cache.get(pid)
            state = LIVE
            if cached is None:
                if pid in self._missing:
                    state = GONE if self.host_namespace else HIDDEN
                # else: it exists but we were denied access to it: alive
            elif cached[3]:
                state = ZOMBIE
            if state == LIVE:
                since.pop(pid, None)
                out[pid] = _LIVE
            else:
                out[pid] = (state, now - since.setdefault(pid, now))
        wanted = set(pids)
        for gone in [p for p in since if p not in wanted]:
            del since[gone]
        return out


def _text(raw: str) -> str:
    """psutil's text of bytes any process can choose (its comm, argv[0]) as text any encoder takes: psutil decodes
    them with ``surrogateescape``, so invalid UTF-8 arrives as lone surrogates, which no encoder takes (one process
    named with a 0xff byte made /metrics fail); back to the bytes, then U+FFFD for each invalid one."""
    return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _name(proc: psutil.Process) -> str | None:
    """psutil's name (``comm``, or the base name of ``argv[0]`` when comm is its truncated start), as text, cut to
    :data:`MAX_NAME_CHARS`."""
    try:
        return _text(proc.name())[:MAX_NAME_CHARS]
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return None


def _user(proc: psutil.Process) -> str | None:
    """The name of the real uid (the uid itself when the passwd database has none: psutil's rule)."""
    try:
        return _text(proc.username())
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
        return None
