"""The real daemon (``gpuwatchd sim``) started on a state database that a long receiver outage filled, with rows of
a receiver since removed: it holds a page per receiver, not the queue (peak RSS measured against the same daemon on
an empty state directory), reports the whole queue's depth, and fails the orphans' rows. The 200k-row figures are
``bench/outbox_start.py``'s; this test keeps the file small enough for CI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from support import ROOT, DaemonProcess, free_port, metrics_when, value, wait_until

from gpuwatchd.notify.store.database import DB_NAME, SCHEMA, connect

PENDING, ORPHANS, PAYLOAD = 20_000, 5_000, 4_000
# What a page per receiver may add over an empty daemon (2 x 256 rows of 4 kB, plus the dedup entries and the
# SQLite cache); holding the queue whole added ~200 MB here.
HEADROOM_MB = 40.0


class Down(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def down() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    server.server_close()


def fill(db_path: Path, now: float) -> None:
    db = connect(db_path)
    db.executescript(SCHEMA)
    db.execute("BEGIN")
    text = "x" * PAYLOAD
    db.executemany(
        "INSERT INTO outbox (id, receiver, group_key, idempotency_key, payload, firing, resolved, created,"
        " next_attempt, status) VALUES (?, ?, ?, ?, ?, ?, '[]', ?, ?, 'pending')",
        ((i + 1, "team" if i < PENDING else "gone", f'{{}}:{{uuid="GPU-{i % 64}"}}', f"key-{i}",
          json.dumps({"text": text}), json.dumps([f"fp{i % 64}"]), now - 3600, now) for i in range(PENDING + ORPHANS)),
    )  # fmt: skip
    db.execute("COMMIT")
    db.close()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def start(tmp: Path, state: Path, hook: str) -> DaemonProcess:
    cfg = tmp / f"{state.name}.yml"
    cfg.write_text(yaml.safe_dump({"host": "desk", "state_dir": str(state), "notify": {
        "max_retry_age": "30d", "receivers": [{"name": "team", "type": "slack", "url": hook}]}}))  # fmt: skip
    port = free_port()
    log_path = tmp / f"{state.name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--config", str(cfg),
             "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", cfg, log_path)

    def serving() -> bool:
        assert proc.poll() is None, d.log()
        try:
            return d.get("/healthz", timeout=5)[0] == 200
        except OSError:
            return False

    wait_until(serving, "the sim to serve", timeout=300)  # a liveness bound: the first open checks the file
    return d


def test_a_big_outbox_is_not_loaded_whole(tmp_path: Path, down: str) -> None:
    empty = start(tmp_path, tmp_path / "empty", down)
    try:
        metrics_when(empty, lambda m: value(m, "gpuwatchd_notify_receivers") == 1, "the receiver configured")
        baseline = peak_rss_mb(empty.proc.pid)
    finally:
        assert empty.stop() == 0
    state = tmp_path / "state"
    state.mkdir()
    fill(state / DB_NAME, time.time())
    d = start(tmp_path, state, down)
    try:
        m = metrics_when(d, lambda m: value(m, "gpuwatchd_notification_outbox_depth", receiver="team") == PENDING
                         and value(m, "gpuwatchd_notification_outbox_depth", receiver="gone") in (None, 0.0),
                         "the whole queue counted and the orphans failed")  # fmt: skip
        assert m
        peak = peak_rss_mb(d.proc.pid)
        assert peak < baseline + HEADROOM_MB, (peak, baseline)
        assert "receiver 'gone' is no longer configured: its 5000 undelivered notifications were dropped" in d.log()
    finally:
        assert d.stop() == 0
    with sqlite3.connect(state / DB_NAME) as db:
        counts = dict(db.execute("SELECT receiver || ':' || status, COUNT(*) FROM outbox GROUP BY 1").fetchall())
    assert counts == {"team:pending": PENDING, "gone:failed": ORPHANS}
