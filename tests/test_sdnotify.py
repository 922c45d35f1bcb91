"""sd_notify over a real unix datagram socket, as systemd listens for it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatchd.runtime.sdnotify import SdNotifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    yield s, path
    s.close()


def test_messages_reach_the_socket(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = SdNotifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("serving 2 GPUs")
    assert sock.recv(4096).decode().splitlines() == ["READY=1", "STATUS=serving 2 GPUs"]
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.stopping()
    assert sock.recv(4096).decode().splitlines()[0] == "STOPPING=1"
    assert n.reloading()
    lines = sock.recv(4096).decode().splitlines()
    assert lines[0] == "RELOADING=1" and lines[1].startswith("MONOTONIC_USEC=")


def test_abstract_namespace_socket() -> None:
    name = f"gpuwatchd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(5)
        assert SdNotifier({"NOTIFY_SOCKET": "@" + name}).status("hello")
        assert s.recv(100) == b"STATUS=hello"


def test_without_systemd_nothing_is_sent() -> None:
    n = SdNotifier({})
    assert not n.enabled
    assert not n.ready("x")
    assert not SdNotifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled


def test_send_failure_is_reported_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert not n.watchdog()
    assert not n.watchdog()
    assert sum("cannot notify systemd" in r.message for r in caplog.records) == 1


def test_watchdog_interval_is_half_the_timeout() -> None:
    assert SdNotifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    assert SdNotifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 15.0
    assert SdNotifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert SdNotifier({"WATCHDOG_USEC": "0"}).watchdog_interval is None
    assert SdNotifier({}).watchdog_interval is None
