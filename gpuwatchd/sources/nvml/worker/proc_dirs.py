"""Kept-open ``/proc/PID`` directories of the GPU processes the worker knows: their RSS from ``statm`` opened
relative to the directory, which also tells whether the process is still the one the directory was opened for.

A descriptor of a ``/proc/PID`` directory refers to the process, not to its pid: once that process has been reaped,
opening a file in it fails with ``ESRCH``, and a pid can be reused only after its process has been reaped. So while
``statm`` opens in the kept directory, its pid still names the process it was opened for, and the resolver needs
no start-time check. An exited process that is not yet reaped (a zombie) reads all zeros, as psutil reads it: its
memory was released before it became one.

Cost per read: ``openat`` of one name + ``read`` + ``close``, ~2 us, against ~8 us for psutil's ``memory_info``
(a path walk from ``/proc``, buffered I/O, a named tuple) and ~1 us for a kept-open ``statm`` read with ``pread``.
The kept ``statm`` was tried first: a procfs file keeps its 4 KiB ``seq_file`` buffer while open, so 4,096 kept
processes (16 GPUs x ``top_n`` 256) held ~16.8 MB of unreclaimable kernel memory, where 4,096 ``O_PATH`` directory
descriptors hold ~1.1 MB (``/proc/meminfo`` SUnreclaim, docs/performance.md).

psutil has no call that reads relative to a descriptor, so this is the one read of /proc the worker makes by hand:
the same file, the same fields and the same page size as psutil's ``memory_info().rss``
(``tests/sources/nvml/worker/test_proc_dirs.py`` compares them). Where a directory cannot be kept (the budget
spent, no such process), the resolver reads through psutil as before.
"""

from __future__ import annotations

import contextlib
import os
import resource
import weakref
from collections.abc import Iterable, KeysView

# At most this many descriptors (every process 16 GPUs x top_n 256 keep), and never more than half the soft
# descriptor limit: the worker's other descriptors are NVML's device files (a few per GPU), and a descriptor spent
# here must not fail an NVML call. Processes beyond are read through psutil, with a start-time check, several times
# the CPU each (docs/performance.md, "16x256 on a live fleet"). The unit's LimitNOFILE=8192 gives 4096.
MAX_DIRS = 4096
# statm is seven decimal page counts: 7 x 20 digits and separators at most.
READ_BYTES = 256
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC  # no read access needed: only a base for openat
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def _budget() -> int:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return MAX_DIRS
    return max(0, min(MAX_DIRS, soft // 2))


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _read_rss(dir_fd: int) -> int:
    """RSS in bytes from ``statm`` in the process directory ``dir_fd``; OSError once the process is reaped."""
    fd = os.open("statm", _FILE_FLAGS, dir_fd=dir_fd)
    try:
        raw = os.read(fd, READ_BYTES)
    finally:
        os.close(fd)
    return int(raw.split(None, 2)[1]) * PAGE_SIZE


class ProcDirs:
    """``pid -> descriptor of /proc/PID`` (the host's /proc) for the processes the resolver keeps, within a
    budget."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = _budget() if limit is None else limit
        self._fds: dict[int, int] = {}
        weakref.finalize(self, _close_all, self._fds)  # a resolver dropped without close() (tests) frees its fds

    def __len__(self) -> int:
        return len(self._fds)

    def __contains__(self, pid: int) -> bool:
        return pid in self._fds

    def kept(self) -> KeysView[int]:
        """The pids with a descriptor, as a live view (membership tests in C: the resolver's per-pid loop)."""
        return self._fds.keys()

    def open(self, pid: int) -> bool:
        """Keep a descriptor of the process that has ``pid`` now. False when it cannot be: the budget spent, no
        such process, no descriptor to spare. The caller checks afterwards that the process is the one it means
        (the pid may have been reused just before the open)."""
        if pid in self._fds:
            return True
        if len(self._fds) >= self._limit:
            return False
        try:
            fd = os.open(f"/proc/{pid}", _DIR_FLAGS)
        except OSError:  # ENOENT: gone; EACCES: a hardened /proc; EMFILE/ENFILE: none to spare now
            return False
        self._fds[pid] = fd
        return True

    def rss(self, pid: int) -> int | None:
        """The RSS in bytes of the process kept for ``pid``; None when there is no descriptor for it, or the read
        failed (the process was reaped: ``ESRCH``), in which case the descriptor is released."""
        fd = self._fds.get(pid)
        if fd is None:
            return None
        try:
            return _read_rss(fd)
        except (OSError, IndexError, ValueError):
            self.forget(pid)
            return None

    def rss_of(self, pids: Iterable[int]) -> dict[int, int]:
        """:meth:`rss` of each of ``pids`` that has a descriptor which reads, in one pass (the resolver's per-poll
        loop); those whose read failed are released and left out, as are those without a descriptor."""
        fds = self._fds
        out: dict[int, int] = {}
        failed = []
        for pid in pids:
            fd = fds.get(pid)
            if fd is None:
                continue
            try:
                out[pid] = _read_rss(fd)
            except (OSError, IndexError, ValueError):
                failed.append(pid)
        for pid in failed:
            self.forget(pid)
        return out

    def forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        _close_all(self._fds)
