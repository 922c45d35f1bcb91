"""Who is at the other end of a unix socket, as the kernel says: ``SO_PEERCRED`` and the pid namespaces.

``SO_PEERCRED`` gives the peer's pid as seen from the daemon's pid namespace, whatever the client claims. NVML lists
processes by their pid in the namespace of the /proc the daemon reads (the host's, in the shipped deployments:
hostPID in Kubernetes); ``NSpid:`` in /proc/PID/status lists the process' pid in every namespace from that /proc's
down to its own, so its first entry is the pid NVML lists, and its last the pid the client sees as ``os.getpid()``.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
STATUS_MAX_BYTES = 16 * 1024  # /proc/PID/status is ~1.5 KB; read no more whatever is mounted there


@dataclass(frozen=True, slots=True)
class Peer:
    """A connected process: ``pid`` in the daemon's namespace, the host pid NVML lists (``host_pid``) and the pid it
    sees itself as (``own_pid``, differs inside a container)."""

    pid: int
    uid: int
    gid: int
    host_pid: int
    own_pid: int


def credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the peer of a connected unix stream socket; None when the kernel has none (pid 0: a peer
    in a pid namespace the daemon cannot see)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    pid, uid, gid = _UCRED.unpack(raw)
    return (pid, uid, gid) if pid > 0 else None


def ns_pids(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, ...] | None:
    """The ``NSpid:`` line of /proc/PID/status (outermost namespace first); None when the process is gone or the
    line is absent (kernels before 4.1)."""
    try:
        with (proc_root / str(pid) / "status").open("rb") as f:
            text = f.read(STATUS_MAX_BYTES)
    except OSError:
        return None
    for line in text.split(b"\n"):
        if line.startswith(b"NSpid:"):
            try:
                pids = tuple(int(x) for x in line[6:].split())
            except ValueError:
                return None
            return pids or None
    return None


def identify(sock: socket.socket, proc_root: Path = Path("/proc")) -> Peer | None:
    """The peer of ``sock`` with its host pid (pid namespaces translated); None without kernel credentials."""
    cred = credentials(sock)
    if cred is None:
        return None
    pid, uid, gid = cred
    nspids = ns_pids(pid, proc_root)
    if nspids is None:
        return Peer(pid, uid, gid, pid, pid)
    return Peer(pid, uid, gid, nspids[0], nspids[-1])
