"""Listening sockets: `[::]` is dual-stack (IPv4 clients too, like node_exporter); other hosts bind as given."""

from __future__ import annotations

import socket

import pytest

from gpuwatchd.exporter.server import listen_sockets


def _have_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _have_ipv6(), reason="no IPv6 on this machine")
def test_ipv6_any_accepts_ipv4_and_ipv6() -> None:
    (sock,) = listen_sockets("::", 0)
    with sock:
        sock.listen()
        sock.setblocking(True)
        port = sock.getsockname()[1]
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as c:
                c.settimeout(10)
                c.connect((addr, port))
                conn, _ = sock.accept()
                conn.close()


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
