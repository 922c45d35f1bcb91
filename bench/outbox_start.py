"""Start-up with a big outbox: a receiver down for a long time left ``--pending`` notifications queued, and a
receiver since removed from the config left ``--orphans``. The real daemon (``gpuwatchd sim --scenario idle``) is
started on that state directory; measured: seconds from spawn to the first ``/healthz`` answer, its RSS then and
its peak RSS (``VmHWM``), and the outbox depth it reports. The receiver answers 503 (still down), so nothing
drains during the measure.

    python bench/outbox_start.py [--pending 200000] [--orphans 50000] [--payload-bytes 2500]

Last line: ``start_s=... rss_mb=... peak_rss_mb=... depth=... orphans_failed=...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatchd.notify.store.database import DB_NAME, SCHEMA, connect  # noqa: E402


class Down(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def make_db(path: Path, pending: int, orphans: int, payload_bytes: int, now: float) -> None:
    """An outbox as a long outage leaves it: one row per group change, a Slack-sized message each."""
    db = connect(path)
    db.executescript(SCHEMA)
    text = "x" * payload_bytes
    db.execute("BEGIN")
    rows = (
        (i + 1, "team" if i < pending else "gone", f'{{}}:{{uuid="GPU-{i % 64:02d}"}}', f"key-{i}",
         json.dumps({"text": text}), json.dumps([f"fp{i % 64}"]), "[]", now - 3600 + i * 0.01, now)
        for i in range(pending + orphans)
    )  # fmt: skip
    db.executemany(
        "INSERT INTO outbox (id, receiver, group_key, idempotency_key, payload, firing, resolved, created,"
        " next_attempt, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending')",
        rows,
    )
    db.execute("COMMIT")
    db.close()


def rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=200_000)
    ap.add_argument("--orphans", type=int, default=50_000)
    ap.add_argument("--payload-bytes", type=int, default=2500)
    args = ap.parse_args()
    down = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=down.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        state = tmp / "state"
        state.mkdir()
        t0 = time.monotonic()
        make_db(state / DB_NAME, args.pending, args.orphans, args.payload_bytes, time.time())
        print(f"made the database in {time.monotonic() - t0:.1f} s: {(state / DB_NAME).stat().st_size >> 20} MiB")
        cfg = tmp / "g.yml"
        cfg.write_text(json.dumps({"host": "bench", "state_dir": str(state), "notify": {
            "max_retry_age": "30d", "receivers": [{"name": "team", "type": "slack",
                                                   "url": f"http://127.0.0.1:{down.server_port}/hook"}]}}))
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        log = (tmp / "sim.log").open("wb")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--config", str(cfg),
                                 "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        try:
            while True:
                if proc.poll() is not None:
                    print((tmp / "sim.log").read_text())
                    return 1
                try:
                    with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.02)
            start_s = time.monotonic() - t0
            rss = rss_mb(proc.pid, "VmRSS")
            print(f"/healthz after {start_s:.1f} s at {rss:.0f} MB")
            time.sleep(2.0)  # the workers' first page and the orphans' failing
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
                metrics = r.read().decode()
            depth = sum(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("gpuwatchd_notification_outbox_depth{"))  # fmt: skip
            peak = rss_mb(proc.pid, "VmHWM")
            rss_after = rss_mb(proc.pid, "VmRSS")
        finally:
            t_stop = time.monotonic()
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            stop_s = time.monotonic() - t_stop
            log.close()
        db = sqlite3.connect(state / DB_NAME)
        failed = db.execute("SELECT COUNT(*) FROM outbox WHERE receiver = 'gone' AND status = 'failed'").fetchone()[0]
        db.close()
    down.shutdown()
    print(f"rss after 2 s: {rss_after:.0f} MB; stopped in {stop_s:.1f} s")
    print(f"start_s={start_s:.2f} rss_mb={rss:.0f} peak_rss_mb={peak:.0f} depth={depth:.0f} orphans_failed={failed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
