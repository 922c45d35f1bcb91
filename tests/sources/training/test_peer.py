"""Peer identity from the kernel: SO_PEERCRED, and NSpid for the pid a process sees in its own namespace."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gpuwatchd.sources.training import peer


def test_the_kernel_names_the_peer() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer.credentials(a) == (os.getpid(), os.getuid(), os.getgid())
        who = peer.identify(a)
    assert who is not None and who.pid == who.host_pid == who.own_pid == os.getpid()


def _status(root: Path, pid: int, nspid: str | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    lines = ["Name:\tpython", f"Pid:\t{pid}"] + ([f"NSpid:\t{nspid}"] if nspid is not None else []) + ["Uid:\t0"]
    (d / "status").write_text("\n".join(lines) + "\n")


def test_a_containerised_process_has_its_host_pid_first_and_its_own_last(tmp_path: Path) -> None:
    _status(tmp_path, 91234, "91234\t57\t1")
    assert peer.ns_pids(91234, tmp_path) == (91234, 57, 1)
    _status(tmp_path, 5, None)  # a kernel before 4.1: no NSpid line
    assert peer.ns_pids(5, tmp_path) is None
    _status(tmp_path, 6, "six")
    assert peer.ns_pids(6, tmp_path) is None
    assert peer.ns_pids(7, tmp_path) is None  # gone


def test_no_credentials_on_a_socket_without_a_peer() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        assert peer.identify(s) is None
