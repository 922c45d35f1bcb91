"""Start-up with a big outbox: a receiver down for a long time left ``--pending`` notifications queued, and a
receiver since removed from the config left ``--orphans``. The real daemon (``gpuwatchd sim --scenario idle``) is
started on that state directory (and first on an empty one, for the baseline: start times on a loaded machine
are mostly the machine); measured: seconds from spawn to the first ``/healthz`` answer, its RSS then and its peak
RSS (``VmHWM``), and the outbox depth it reports; once as the file was written, once restarted after a clean stop.
The receiver answers 503 (still down), so nothing drains during the measure.

    python bench/outbox_start.py [--pending 200000] [--orphans 50000] [--payload-bytes 2500]

Last line: ``start_s=... restart_s=... empty_start_s=... rss_mb=... peak_rss_mb=... empty_rss_mb=... depth=...
orphans_failed=...``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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


def run_daemon(tmp: Path, state: Path, receiver_url: str, label: str) -> dict[str, float]:
    """Start the sim on ``state``; seconds to the first /healthz, RSS then, peak RSS and depth 2 s later; stopped
    with SIGTERM (a clean close)."""
    cfg = tmp / "g.yml"
    cfg.write_text(json.dumps({"host": "bench", "state_dir": str(state), "notify": {
        "max_retry_age": "30d", "receivers": [{"name": "team", "type": "slack", "url": receiver_url}]}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / f"sim-{label}.log"
    with log_path.open("wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--config", str(cfg),
                                 "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        try:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(log_path.read_text())
                try:
                    with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.02)
            out = {"start_s": time.monotonic() - t0, "rss_mb": rss_mb(proc.pid, "VmRSS")}
            time.sleep(2.0)  # the workers' first page and the orphans' failing
            with urllib.request.urlopen(f"{url}/metrics", timeout=60) as r:
                metrics = r.read().decode()
            out["depth"] = sum(float(line.split()[-1]) for line in metrics.splitlines()
                               if line.startswith("gpuwatchd_notification_outbox_depth{"))  # fmt: skip
            out["peak_rss_mb"] = rss_mb(proc.pid, "VmHWM")
        finally:
            t_stop = time.monotonic()
            proc.terminate()
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out["stop_s"] = time.monotonic() - t_stop
    print(f"{label}: " + " ".join(f"{k}={v:.2f}" for k, v in out.items()), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=200_000)
    ap.add_argument("--orphans", type=int, default=50_000)
    ap.add_argument("--payload-bytes", type=int, default=2500)
    args = ap.parse_args()
    down = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    threading.Thread(target=down.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{down.server_port}/hook"
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        empty = run_daemon(tmp, tmp / "empty", hook, "empty state")
        state = tmp / "state"
        state.mkdir()
        t0 = time.monotonic()
        make_db(state / DB_NAME, args.pending, args.orphans, args.payload_bytes, time.time())
        print(f"made the database in {time.monotonic() - t0:.1f} s: {(state / DB_NAME).stat().st_size >> 20} MiB")
        # First start on the file as written (no clean-close stamp: the whole-file check runs, the group index is
        # built), then a restart after a clean stop (what a daemon restarted during an outage sees).
        first = run_daemon(tmp, state, hook, "first start")
        again = run_daemon(tmp, state, hook, "restart")
        db = sqlite3.connect(state / DB_NAME)
        failed = db.execute("SELECT COUNT(*) FROM outbox WHERE receiver = 'gone' AND status = 'failed'").fetchone()[0]
        db.close()
    down.shutdown()
    print(f"start_s={first['start_s']:.2f} restart_s={again['start_s']:.2f} empty_start_s={empty['start_s']:.2f}"
          f" rss_mb={first['rss_mb']:.0f} peak_rss_mb={max(first['peak_rss_mb'], again['peak_rss_mb']):.0f}"
          f" empty_rss_mb={empty['peak_rss_mb']:.0f} depth={again['depth']:.0f} orphans_failed={failed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
