"""The HTTP side of the real daemon (`gpuwatchd sim` in a subprocess) under abuse: an idle-connection flood past the
open-file limit, a slowloris, malformed requests, and `[::]` answering IPv4 too.

The daemon runs under the systemd default open-file limit (1024, set on the child only); the flood is 2000
connections, which used to end the daemon with EMFILE in the NVML supervisor. Every loop is bounded in count and in
wall-clock time (``support.wait_until``); nothing asserts how fast anything is.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import ROOT, START_SECONDS, DaemonProcess, free_port, parse_metrics, value, wait_until

DAEMON_NOFILE = 1024  # systemd's default soft limit for services
FLOOD = 2000
MALFORMED: list[bytes] = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n: empty-name\r\n\r\n",
    b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
    b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"v" * 10_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET / FOO/1.1\r\nHost: x\r\n\r\n",
    b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked, foo\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(32) + b"\r\n\r\n",  # a TLS ClientHello
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"\r\n\r\n\r\n",
    b"GET / HTTP/1.1\nHost: x\n\n\x00\x00\x00",
    b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\xff\xfe\xfd\xfc" * 64 + b"\r\n\r\n",
]


def _raise_own_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} open files in the test process, hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """`gpuwatchd sim` (2 GPUs, `idle`) under a 1024 open-file limit, with short HTTP timeouts."""
    with _sim(tmp_path, "127.0.0.1") as d:
        yield d


@contextlib.contextmanager
def _sim(tmp_path: Path, host: str) -> Iterator[DaemonProcess]:
    port = free_port()
    cfg = tmp_path / "gpuwatchd.yml"
    # idle_timeout long enough that the flood below is held off by the cap (eviction), not by the timeout.
    cfg.write_text(yaml.safe_dump({"http": {"idle_timeout": "60s", "header_timeout": "2s"}}))
    log_path = tmp_path / "sim.log"

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (DAEMON_NOFILE, DAEMON_NOFILE))

    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--gpus", "2", "--config", str(cfg),
             "--state-dir", str(tmp_path / "state"), "--listen", listen],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            preexec_fn=limit_files,  # noqa: PLW1509 - setrlimit only; the test process starts no threads
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", cfg, log_path)

    def serving() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{d.log()}"
        with contextlib.suppress(OSError):
            return d.get("/healthz", timeout=2)[0] == 200
        return False

    try:
        wait_until(serving, "gpuwatchd sim to serve", START_SECONDS)
        yield d
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _port(d: DaemonProcess) -> int:
    return int(d.url.rsplit(":", 1)[1])


def _polls(d: DaemonProcess) -> float:
    return value(d.metrics(), "gpuwatchd_last_poll_timestamp_seconds") or 0.0


def test_idle_flood_past_the_fd_limit_keeps_everything_up(daemon: DaemonProcess) -> None:
    _raise_own_nofile(FLOOD + 256)
    first_poll = wait_until(lambda: _polls(daemon), "a first NVML poll")
    socks: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.settimeout(10)
            s.connect(("127.0.0.1", _port(daemon)))
            socks.append(s)
        # Every one was accepted (the oldest idle ones closed to make room), and the daemon answers a scraper.
        assert daemon.get("/healthz", timeout=10)[0] == 200
        m = daemon.metrics()
        limit = value(m, "gpuwatchd_http_connections_limit")
        assert limit is not None and limit <= DAEMON_NOFILE - 256
        assert (value(m, "gpuwatchd_http_connections") or 0) <= limit
        assert (value(m, "gpuwatchd_http_connections_closed_total", reason="evicted") or 0) >= FLOOD - limit
        # The NVML supervisor kept polling: readings still advance after the flood.
        wait_until(lambda: _polls(daemon) > first_poll, "NVML polls to go on after the flood")
        status, body = daemon.get("/readyz")
        assert status == 200, body
    finally:
        for s in socks:
            s.close()
    assert daemon.proc.poll() is None
    log = daemon.log()
    assert "Too many open files" not in log and "Traceback" not in log and " ERROR " not in log, log[-3000:]


def test_slowloris_is_cut_off_and_scrapes_go_on(daemon: DaemonProcess) -> None:
    s = socket.create_connection(("127.0.0.1", _port(daemon)), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    closed = False
    try:
        for _ in range(600):  # one byte of a header every ~0.1 s: bounded, and the 2 s header timeout ends it sooner
            s.sendall(b"v")
            time.sleep(0.1)  # the attacker's pace, not a wait for a condition
            wait_until(lambda: daemon.get("/healthz")[0] == 200, "healthz during the slowloris", timeout=10)
    except OSError:
        closed = True
    finally:
        s.close()
    assert closed, "the slow request's connection was never closed"
    m = parse_metrics(daemon.get("/metrics")[1])
    assert (value(m, "gpuwatchd_http_connections_closed_total", reason="header_timeout") or 0) >= 1


def test_malformed_requests_get_4xx_and_no_error_log(daemon: DaemonProcess) -> None:
    for raw in MALFORMED:
        with socket.create_connection(("127.0.0.1", _port(daemon)), timeout=10) as s:
            s.sendall(raw)
            head = b""
            with contextlib.suppress(OSError):
                while b"\r\n" not in head and len(head) < 4096:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    head += chunk
        status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/") else b""
        # Answered 4xx, or (for what is not HTTP at all) closed without an answer; never a 5xx.
        assert head == b"" or status.startswith(b"4"), (raw[:60], head[:80])
    m = daemon.metrics()
    assert (value(m, "gpuwatchd_http_bad_requests_total") or 0) >= len(MALFORMED) // 2
    assert daemon.get("/healthz")[0] == 200
    log = daemon.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_listen_on_ipv6_any_is_dual_stack(tmp_path: Path) -> None:
    with _sim(tmp_path, "::") as d:
        port = _port(d)
        for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as s:
                s.settimeout(10)
                s.connect((addr, port))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert s.recv(64).startswith(b"HTTP/1.1 200"), addr
