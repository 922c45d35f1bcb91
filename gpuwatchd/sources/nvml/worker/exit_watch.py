"""Which of the GPU processes the worker knows have exited, from pidfds: one ``poll(2)`` per poll for all of them.

A pidfd (``pidfd_open(2)``, Linux 5.3) refers to one process, not to its pid: it becomes readable once that
process exits (zombie or reaped), and a pid can be reused only after its process exited. So while a process'
pidfd is not readable, its pid still names it and the resolver needs no start-time check (a read of
``/proc/PID/stat`` per process per poll: ~9 us each, 80 of them a poll at 8x32; the poll of 80 pidfds is ~3 us).
Where pidfds are not available (an older kernel, a seccomp filter, the descriptor budget spent), the resolver
checks start times as before: a pid not watched here is simply checked the old way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import weakref

# At most this many pidfds (every process 16 GPUs x top_n 256 keep), and never more than half the soft descriptor
# limit: the worker's other descriptors are NVML's device files (a few per GPU), and a descriptor spent here must not
# fail an NVML call. Processes beyond are checked by start time, ~4x the CPU each: at 16x256 with 1024 pidfds the
# worker used 8.6 % of a core (docs/performance.md). The unit's LimitNOFILE=8192 gives 4096.
MAX_PIDFDS = 4096


def _budget() -> int:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return MAX_PIDFDS
    return max(0, min(MAX_PIDFDS, soft // 2))


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class ExitWatch:
    """pidfds of watched processes; :meth:`exited` forgets (and returns) those whose process exited."""

    def __init__(self, limit: int | None = None) -> None:
        self.enabled = hasattr(os, "pidfd_open")
        self._limit = _budget() if limit is None else limit
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self._pids: dict[int, int] = {}  # pidfd -> pid
        self._poll = select.poll()
        weakref.finalize(self, _close_all, self._fds)  # a resolver dropped without close() (tests) frees its fds

    def __len__(self) -> int:
        return len(self._fds)

    def watched(self, pid: int) -> bool:
        """True while ``pid``'s watched process has not been seen to exit (call :meth:`exited` first, each poll)."""
        return pid in self._fds

    def watch(self, pid: int) -> bool:
        """Watch the process that has ``pid`` now. False when it cannot be: no pidfd support, the budget spent, no
        such process. The caller checks afterwards that the process is the one it means (the pid may have been
        reused just before)."""
        if pid in self._fds:
            return True
        if not self.enabled or len(self._fds) >= self._limit:
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):  # no pidfds here (old kernel, seccomp)
                self.enabled = False
            return False  # ESRCH: gone; EMFILE/ENFILE: no descriptor to spare now
        self._fds[pid] = fd
        self._pids[fd] = pid
        self._poll.register(fd, select.POLLIN)
        return True

    def exited(self) -> list[int]:
        """The watched pids whose process exited since the last call; they are no longer watched."""
        if not self._fds:
            return []
        out = []
        for fd, _ in self._poll.poll(0):
            pid = self._pids.get(fd)
            if pid is not None:
                out.append(pid)
                self.forget(pid)
        return out

    def forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is None:
            return
        del self._pids[fd]
        self._poll.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)
