"""Host facts of one process from ``/proc`` (proc(5)): its stat line, name, user. Used by the NVML worker.

Hand-written rather than psutil on purpose: the worker needs three facts about a few pids per poll, and importing
psutil cost the worker 1.6 MB of its ~15 MB and ~10 ms of its start (docs/performance.md). The rules are psutil's
own (5.9/6.x ``_pslinux``), so the values are the ones psutil gives and the tests compare them with psutil:

- name: ``comm`` from ``stat``; when it is 15 characters (the kernel truncates it there, TASK_COMM_LEN) and the
  base name of ``argv[0]`` starts with it, that base name (``gnome-keyring-daemon``, not ``gnome-keyring-d``);
- user: the name of the *real* uid (``Uid:`` in ``status``), the uid as a string when the passwd database has none;
- RSS: ``rss`` of ``stat`` (pages) times the page size: the counter ``statm`` reports as resident, read once
  with the start time (pid-reuse check) and the state (zombie) in the same line.
"""

from __future__ import annotations

import os
import pwd
from typing import NamedTuple

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
COMM_LEN = 15  # TASK_COMM_LEN - 1: the longest comm the kernel keeps
MAX_NAME_CHARS = 255  # NAME_MAX: argv[0] can be 128 KiB; its base name becomes a label value


class Stat(NamedTuple):
    comm: str
    state: str  # R, S, D, Z, T, ...
    start_time: int  # clock ticks after boot: with the pid, names one process (a reused pid has another)
    rss_bytes: int


def read_stat(root: str, pid: int) -> Stat:
    """``/proc/<pid>/stat``, parsed. Raises FileNotFoundError when there is no such process (any other OSError:
    access denied, e.g. ``hidepid``); ProcessLookupError (ESRCH, a process ending mid-read) as FileNotFoundError."""
    try:
        with open(f"{root}/{pid}/stat", "rb") as f:
            data = f.read()
    except ProcessLookupError:
        raise FileNotFoundError(pid) from None
    if not data:  # a process reaped while we read
        raise FileNotFoundError(pid)
    # "pid (comm) S ppid ...": comm may hold spaces and parentheses, so split at its first '(' and last ')'.
    open_at = data.find(b"(")
    close_at = data.rfind(b")")
    fields = data[close_at + 2:].split()
    # after comm: field 3 (state) is fields[0], so field n is fields[n - 3]: starttime 22, rss 24 (proc(5))
    return Stat(_text(data[open_at + 1:close_at]), fields[0].decode(), int(fields[19]),
                int(fields[21]) * PAGE_SIZE)


def process_name(root: str, pid: int, comm: str) -> str:
    """``comm``, or the base name of ``argv[0]`` when comm is the truncated start of it."""
    if len(comm) < COMM_LEN:
        return comm
    try:
        with open(f"{root}/{pid}/cmdline", "rb") as f:
            data = f.read()
    except OSError:
        return comm  # gone or denied since its stat was read: the truncated name is better than none
    if not data:  # a zombie, a kernel thread
        return comm
    # argv is NUL-separated; a process that rewrote it (setproctitle) may use spaces instead
    sep = b"\x00" if data.endswith(b"\x00") else b" "
    argv0 = data.rstrip(sep).split(sep)[0]
    if sep == b"\x00" and b"\x00" not in data.rstrip(sep) and b" " in argv0:
        argv0 = argv0.split(b" ")[0]
    extended = os.path.basename(_text(argv0))[:MAX_NAME_CHARS]
    return extended if extended.startswith(comm) else comm


def user_name(root: str, pid: int) -> str | None:
    """The name of the real uid of ``pid``; the uid itself when unknown to the passwd database; None if unreadable."""
    try:
        with open(f"{root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    uid = int(line.split()[1])
                    break
            else:
                return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        return _text(os.fsencode(pwd.getpwuid(uid).pw_name))
    except KeyError:  # a uid without a passwd entry (containers)
        return str(uid)


def _text(raw: bytes) -> str:
    """Bytes any process can choose (its comm, argv[0]) as text: invalid UTF-8 as U+FFFD. ``os.fsdecode`` made
    lone surrogates of it, which no encoder takes: one process named with a 0xff byte made /metrics fail."""
    return raw.decode("utf-8", "replace")
