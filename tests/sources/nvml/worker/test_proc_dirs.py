"""Kept-open /proc/PID directories: psutil's RSS from their statm, a zombie's zeros, a reaped process' failure,
the budget."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpuwatchd.sources.nvml.worker import proc_dirs
from gpuwatchd.sources.nvml.worker.proc_dirs import ProcDirs


def _child() -> subprocess.Popen[bytes]:
    # holds ~20 MB so that its RSS is well above a page and moves when it grows
    return subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(20 << 20); sys.stdin.readline();"
                             "c = bytearray(30 << 20); sys.stdin.read()"], stdin=subprocess.PIPE)


def _settled_rss(proc: psutil.Process, handles: ProcDirs, pid: int) -> tuple[int | None, int]:
    """The descriptor's RSS and psutil's, read back to back until they agree twice (the child may be growing)."""
    last = (None, -1)
    for _ in range(200):
        got = (handles.rss(pid), proc.memory_info().rss)
        if got[0] == got[1] and got == last:
            return got
        last = got
        time.sleep(0.02)
    return last


def test_rss_is_psutils_and_follows_the_process() -> None:
    child = _child()
    assert child.stdin is not None
    try:
        handles = ProcDirs()
        assert handles.open(child.pid)
        proc = psutil.Process(child.pid)
        mine, theirs = _settled_rss(proc, handles, child.pid)
        assert mine == theirs
        first = mine
        child.stdin.write(b"grow\n")
        child.stdin.flush()
        for _ in range(300):  # it allocates 30 MB more: the same descriptor reads the new size
            mine, theirs = _settled_rss(proc, handles, child.pid)
            if mine is not None and first is not None and mine > first + (20 << 20):
                break
            time.sleep(0.02)
        assert mine == theirs
        assert mine is not None and first is not None and mine > first + (20 << 20)
    finally:
        child.kill()
        child.communicate()


def test_a_zombie_reads_zero_and_a_reaped_process_fails_and_is_released() -> None:
    child = _child()
    handles = ProcDirs()
    assert handles.open(child.pid)
    before = len(os.listdir("/proc/self/fd"))
    child.kill()
    for _ in range(300):
        if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.02)
    assert handles.rss(child.pid) == 0  # exited, not reaped: its memory is released
    assert child.pid in handles
    child.communicate()  # reaped: the pid may now be reused, and the descriptor no longer reads
    after_reap = len(os.listdir("/proc/self/fd"))  # less the child's stdin pipe
    assert handles.rss(child.pid) is None
    assert child.pid not in handles
    assert len(os.listdir("/proc/self/fd")) == after_reap - 1
    assert after_reap < before


def test_no_such_process_and_no_descriptor() -> None:
    handles = ProcDirs()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert not handles.open(pid_max + 1)  # no such pid
    assert handles.rss(os.getpid()) is None  # never opened
    assert len(handles) == 0


def test_the_budget_is_half_the_soft_limit_and_at_most_max_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (64, 1 << 20))
    assert proc_dirs._budget() == 32
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert proc_dirs._budget() == proc_dirs.MAX_DIRS
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert proc_dirs._budget() == proc_dirs.MAX_DIRS
    handles = ProcDirs(limit=1)
    me = os.getpid()
    assert handles.open(me)
    assert handles.open(me)  # already kept: no second descriptor
    assert not handles.open(os.getppid())  # the budget is spent
    rss = handles.rss(me)
    assert rss is not None and rss > 0
    handles.close()
    assert len(handles) == 0
