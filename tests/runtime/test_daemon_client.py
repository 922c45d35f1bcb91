"""What status says when it speaks TLS to a plain-HTTP server (runtime/daemon_client.py ``tls_problem``); the TLS and
basic-auth daemon cases are in tests/integration/test_cli_tls.py."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

from gpuwatchd.runtime.exitcodes import EXIT_UNREACHABLE

ROOT = Path(__file__).resolve().parents[2]


def test_https_to_a_plain_http_server_says_use_http() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gpuwatchd", "status", "--url", f"https://127.0.0.1:{server.server_address[1]}"],
            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
            check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    (line,) = r.stderr.strip().splitlines()
    assert r.returncode == EXIT_UNREACHABLE
    assert line.endswith("TLS handshake failed: the daemon does not serve TLS at this address; use an http:// URL")
