"""``gpuwatchd probe``: through a running daemon (its lock and baselines), and directly without one."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from gpuwatchd.cli.probe import render
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import make_state, write_state

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpuwatchd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatchd", *args], env=env or ENV, capture_output=True,
                          text=True, timeout=600, check=False)


def test_without_a_daemon_it_runs_directly_and_says_why_it_cannot(tmp_path: Path, standin_libdir: Path) -> None:
    state = tmp_path / "state"
    write_state(state, make_state(1))
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"nvml": {"library_path": str(standin_libdir)},
                                   "state_dir": str(tmp_path / "state-dir")}))
    nobody = f"http://127.0.0.1:{_free_port()}"
    out = _gpuwatchd("probe", "--config", str(cfg), "--url", nobody, env={**ENV, STATE_ENV: str(state)})
    assert out.returncode == 1, out.stderr
    # A real run probes the cuda device; this machine's torch is a CPU build (the stand-in is not a GPU).
    assert "no daemon running: probes run directly" in out.stdout
    assert "probes unavailable: torch_without_cuda" in out.stdout


def test_through_a_daemon(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    sim = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "probe-sdc", "--listen",
                            f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "sd")], env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        out = _gpuwatchd("probe", "--url", url, "--gpu", "1", "--probe", "gemm", "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        result = json.loads(out.stdout)
        (gpu,) = result["gpus"]
        assert gpu["index"] == 1 and [r["probe"] for r in gpu["records"]] == ["gemm"]
        assert gpu["records"][0]["result"] == "pass"
        assert "flops_float32" in render(result)
        status = _gpuwatchd("status", "--url", url)
        assert "PROBE" in status.stdout and "pass" in status.stdout
        bad = _gpuwatchd("probe", "--url", url, "--gpu", "9")
        assert bad.returncode == 1 and "no present GPU '9'" in bad.stderr
    finally:
        sim.send_signal(signal.SIGTERM)
        try:
            sim.wait(60)
        except subprocess.TimeoutExpired:
            sim.kill()  # never leave it running (and unreaped) behind a failing test
            sim.wait()
            raise


def test_a_listener_that_never_answers_is_not_no_daemon(tmp_path: Path) -> None:
    """A timeout means something is there (a daemon busy running probes answers late): running the probes here as
    well could put two runs on one GPU. One line, exit 1, the probes not run."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepted by the kernel, never read, never answered
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        out = _gpuwatchd("probe", "--config", str(_plain_config(tmp_path)), "--url", url, "--timeout", "2")
    assert out.returncode == 1
    assert "no daemon running" not in out.stdout
    assert f"gpuwatchd probe: {url}: no answer within 2 s" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


class _Html500(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"<html><body><h1>500 Internal Server Error</h1></body></html>"
        self.send_response(500)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_non_json_500_is_one_line_saying_so(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html500)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = _gpuwatchd("probe", "--config", str(_plain_config(tmp_path)), "--url", url, "--timeout", "30")
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 1
    assert "gpuwatchd probe: the daemon answered HTTP 500 with a body that is not JSON: '<html>" in out.stderr
    assert "Expecting value" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "no daemon running" not in out.stdout


def _plain_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state-dir")}))
    return cfg


def test_hostile_timeouts_and_urls_are_one_usage_line(tmp_path: Path) -> None:
    cfg = str(_plain_config(tmp_path))
    for args in (["--timeout", "inf"], ["--timeout", "nan"], ["--timeout", "-1"], ["--timeout", "1e308"],
                 ["--url", "http://[::1"], ["--url", "ftp://127.0.0.1:9945"]):
        out = _gpuwatchd("probe", "--config", cfg, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.strip().splitlines()[-1].startswith("gpuwatchd probe: error: argument"), out.stderr
        assert "Traceback" not in out.stderr
