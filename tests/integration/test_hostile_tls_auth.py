"""The real daemon (`gpuwatchd sim`) behind TLS and basic auth, under the systemd default open-file limit, attacked
as in issue 21: TLS connections that never send a ClientHello past the descriptor limit, and a wrong-password flood.

Asserted: the connection guard counts and caps TLS connections from accept (no EMFILE, no traceback per connection,
the NVML worker keeps polling, no GPU taken as removed), and under the password flood a scrape with a credential
that passed before answers within 1 s while a new correct login gets through after a bounded wait.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import os
import resource
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml
from support import ROOT, START_SECONDS, Samples, free_port, parse_metrics, value, wait_until
from tls_files import make_tls_files

DAEMON_NOFILE = 1024  # systemd's default soft limit for services
TLS_FLOOD = 1100
RSS_GROWTH_MB = 150
USERS = {"prometheus": "scrape-pass", "ops": "ops-pass"}
FLOOD_SECONDS = 5.0
FLOOD_CLIENTS = 40
NEW_LOGIN_SECONDS = 20.0  # generous for a busy 2-core box; the queue bound makes it a few seconds


def healthz_seconds() -> float:
    """/healthz bound now: 1 s with a fair share of a core, stretched by the last minute's load per core (the 1 s
    figure itself is measured by bench/kmsg_flood.py, not asserted here)."""
    return 1.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@dataclass
class TlsDaemon:
    proc: subprocess.Popen[bytes]
    port: int
    ctx: ssl.SSLContext
    log_path: Path

    def get(self, path: str, user: str | None = "prometheus", password: str | None = None,
            timeout: float = 10.0) -> tuple[int, str]:
        headers = {}
        if user is not None:
            token = base64.b64encode(f"{user}:{password or USERS[user]}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ctx) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> Samples:
        status, text = self.get("/metrics")
        assert status == 200, status
        return parse_metrics(text)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


def _raise_own_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} open files in the test process, hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDaemon]:
    tmp = tmp_path_factory.mktemp("tls-hostile")
    tls = make_tls_files(tmp)
    web = tmp / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tls.cert), "key_file": str(tls.key)},
        # cost 10, as the docs advise: a check costs what it costs in production
        "basic_auth_users": {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=10)).decode()
                             for u, p in USERS.items()},
    }))  # fmt: skip
    cfg = tmp / "gpuwatchd.yml"
    # A long header timeout, so that it is the cap (evicting the idlest) that holds the flood below, not the timeout.
    cfg.write_text(yaml.safe_dump({"web_config_file": str(web),
                                   "http": {"idle_timeout": "60s", "header_timeout": "20s"}}))
    port = free_port()
    log_path = tmp / "sim.log"

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (DAEMON_NOFILE, DAEMON_NOFILE))

    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--gpus", "2", "--config", str(cfg),
             "--state-dir", str(tmp / "state"), "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            preexec_fn=limit_files,  # noqa: PLW1509 - setrlimit only; the test process starts no threads here
        )  # fmt: skip
    d = TlsDaemon(proc, port, ssl.create_default_context(cafile=str(tls.cert)), log_path)

    def serving() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{d.log()}"
        with contextlib.suppress(OSError):
            return d.get("/healthz", timeout=5)[0] == 200
        return False

    try:
        wait_until(serving, "gpuwatchd sim to serve over TLS", START_SECONDS)
        wait_until(lambda: value(d.metrics(), "gpuwatchd_gpus") == 2, "both GPUs")
        yield d
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log_path.read_text(errors="replace")
    assert "Traceback" not in text and "Too many open files" not in text, text[-5000:]


def _polls(d: TlsDaemon) -> float:
    return value(d.metrics(), "gpuwatchd_last_poll_timestamp_seconds") or 0.0


def test_tls_connections_that_never_say_hello_are_capped_from_accept(daemon: TlsDaemon) -> None:
    _raise_own_nofile(TLS_FLOOD + 256)
    first_poll = wait_until(lambda: _polls(daemon), "a first NVML poll")
    log_lines, rss = len(daemon.log().splitlines()), daemon.rss_mb()
    socks: list[socket.socket] = []
    try:
        for _ in range(TLS_FLOOD):  # TCP connected, then silent: no ClientHello ever
            s = socket.socket()
            s.settimeout(10)
            s.connect(("127.0.0.1", daemon.port))
            socks.append(s)
        assert daemon.get("/healthz", timeout=healthz_seconds())[0] == 200
        m = daemon.metrics()
        limit = value(m, "gpuwatchd_http_connections_limit")
        assert limit is not None and limit <= DAEMON_NOFILE - 256
        assert (value(m, "gpuwatchd_http_connections") or 0) <= limit
        assert (value(m, "gpuwatchd_http_connections_closed_total", reason="evicted") or 0) >= TLS_FLOOD - limit
        assert (value(m, "gpuwatchd_http_tls_handshake_failures_total", reason="closed") or 0) >= TLS_FLOOD - limit
        # The NVML worker keeps polling, and no GPU was taken for removed.
        wait_until(lambda: _polls(daemon) > first_poll, "NVML polls to go on during the flood")
        m = daemon.metrics()
        assert value(m, "gpuwatchd_gpus") == 2 and value(m, "gpuwatchd_nvml_up") == 1
        assert all(v == 1 for (name, _), v in m.items() if name == "gpuwatchd_gpu_present")
        assert daemon.get("/healthz", timeout=healthz_seconds())[0] == 200
    finally:
        for s in socks:
            s.close()
    assert daemon.rss_mb() - rss < RSS_GROWTH_MB
    assert len(daemon.log().splitlines()) - log_lines < 20  # no line per connection
    assert daemon.proc.poll() is None


def test_a_password_flood_leaves_cached_scrapes_fast_and_new_logins_bounded(daemon: TlsDaemon) -> None:
    assert daemon.get("/healthz")[0] == 200  # prometheus' credential passes once and is cached from then on
    rss = daemon.rss_mb()
    stop = time.monotonic() + FLOOD_SECONDS

    def attacker(i: int) -> int:
        n = 0
        while time.monotonic() < stop:
            with contextlib.suppress(OSError):  # timeouts and refusals are the attacker's problem
                daemon.get("/healthz", user="prometheus", password=f"wrong-{i}-{n}", timeout=2.0)
            n += 1
        return n

    with concurrent.futures.ThreadPoolExecutor(FLOOD_CLIENTS + 1) as pool:
        flood = [pool.submit(attacker, i) for i in range(FLOOD_CLIENTS)]
        time.sleep(1.0)  # the flood under way before the checks below
        checked = 0
        while time.monotonic() < stop - 0.5:
            assert daemon.get("/healthz", timeout=healthz_seconds())[0] == 200  # the cached credential
            checked += 1
        start = time.monotonic()
        status = 0
        while time.monotonic() - start < NEW_LOGIN_SECONDS:  # a first login: 503 + Retry-After while the queue is full
            status = daemon.get("/healthz", user="ops", timeout=NEW_LOGIN_SECONDS)[0]
            if status != 503:
                break
            time.sleep(1.0)  # Retry-After
        assert status == 200
        sent = sum(f.result() for f in flood)
    assert checked >= 3 and sent >= FLOOD_CLIENTS
    m = daemon.metrics()
    assert (value(m, "gpuwatchd_http_auth_checks_total", result="wrong") or 0) >= 1
    assert (value(m, "gpuwatchd_http_auth_checks_total", result="cached") or 0) >= checked
    shed = sum(value(m, "gpuwatchd_http_auth_checks_total", result=r) or 0 for r in ("refused", "dropped"))
    assert shed >= 1, "the flood never filled the queue: it tested nothing"
    assert daemon.rss_mb() - rss < RSS_GROWTH_MB
    assert daemon.get("/healthz", timeout=healthz_seconds())[0] == 200
