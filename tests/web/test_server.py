"""Listening sockets: hosts bind as given, a failed bind leaves nothing open. (`[::]` answering IPv4 and IPv6 is
tested against the real daemon: tests/integration/test_http_abuse.py.)"""

from __future__ import annotations

import socket

import pytest

from gpuwatchd.web.server import listen_sockets


def test_ipv4_host_binds_that_address_only() -> None:
    (sock,) = listen_sockets("127.0.0.1", 0)
    with sock:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "127.0.0.1"


def test_bind_failure_is_an_oserror_and_leaves_nothing_open() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            listen_sockets("127.0.0.1", taken.getsockname()[1])
