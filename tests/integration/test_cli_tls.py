"""``status``, ``probe`` and ``doctor`` against a daemon serving TLS with basic auth (runtime/daemon_client.py): the URL
and the trusted certificate come from the config's web config file, the password from $GPUWATCHD_PASSWORD; a wrong
or missing password is a 401 that says what to pass."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from support import ROOT, START_SECONDS, free_port, wait_until
from tls_files import TlsFiles

from gpuwatchd.runtime.daemon_client import PASSWORD_ENV, DaemonClient
from gpuwatchd.runtime.exitcodes import EXIT_UNREACHABLE, EXIT_USAGE
from gpuwatchd.runtime.status_client import StatusUnavailable, fetch_status

USER, PASSWORD = "ops", "s3cret"


@pytest.fixture
def tls_sim(tmp_path: Path, tls_files: TlsFiles) -> Iterator[tuple[Path, str]]:
    """``gpuwatchd sim`` behind TLS + basic auth; yields (its config file, which names the web config, and URL)."""
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tls_files.cert), "key_file": str(tls_files.key)},
        "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()},
    }))  # fmt: skip
    port = free_port()
    cfg = tmp_path / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "web_config_file": str(web)}))
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--gpus", "2", "--config", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    client = DaemonClient(ca_files=(tls_files.cert,), user=USER, password=PASSWORD)

    def serving() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{log_path.read_text()}"
        try:
            status, _ = asyncio.run(fetch_status(url, timeout=10, client=client))  # both requests, in all
        except StatusUnavailable:
            return False
        return len(status.get("gpus") or []) == 2

    try:
        wait_until(serving, "gpuwatchd sim to serve its status over TLS", START_SECONDS)
        yield cfg, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(*args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
    if password is not None:
        env[PASSWORD_ENV] = password
    return subprocess.run([sys.executable, "-m", "gpuwatchd", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=120, check=False)


def test_status_over_tls_with_basic_auth(tls_sim: tuple[Path, str]) -> None:
    cfg, url = tls_sim
    # https and the daemon's own certificate, both from the config's web config file; the password from the env
    r = cli("status", "--config", str(cfg), "--auth-user", USER, "--json", password=PASSWORD)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["status"]["gpus"]) == 2

    r = cli("status", "--config", str(cfg), "--auth-user", USER, password="wrong")
    assert r.returncode == EXIT_UNREACHABLE
    assert f"{url}/api/v1/status: HTTP 401" in r.stderr and "--auth-user NAME" in r.stderr

    r = cli("status", "--config", str(cfg))  # no credentials at all
    assert r.returncode == EXIT_UNREACHABLE and "HTTP 401" in r.stderr

    r = cli("status", "--config", str(cfg), "--auth-user", USER)  # a user but no password anywhere
    assert r.returncode == EXIT_USAGE and PASSWORD_ENV in r.stderr

    r = cli("status", "--url", url.replace("https://", "http://"), "--auth-user", USER, password=PASSWORD)
    assert r.returncode == EXIT_UNREACHABLE and "no gpuwatchd reachable" in r.stderr  # no plain HTTP there


def test_status_checks_the_certificate(tls_sim: tuple[Path, str], tmp_path: Path) -> None:
    from tls_files import make_tls_files

    _, url = tls_sim
    other = make_tls_files(tmp_path, "other")  # a CA that did not sign the daemon's certificate
    r = cli("status", "--url", url, "--ca-file", str(other.cert), "--auth-user", USER, password=PASSWORD)
    assert r.returncode == EXIT_UNREACHABLE and "certificate verify failed" in r.stderr


def test_probe_and_doctor_carry_the_credentials(tls_sim: tuple[Path, str], tmp_path: Path) -> None:
    cfg, url = tls_sim
    r = cli("probe", "--config", str(cfg), "--auth-user", USER, "--json", password="wrong")
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "--auth-user NAME" in r.stderr
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")
    r = cli("doctor", "--config", str(cfg), "--auth-user", USER, "--auth-password-file", str(pw), "--json",
            "--deadline", "10")
    checks = {(c["group"], c["check"]): c for c in json.loads(r.stdout)["checks"]}
    assert checks[("daemon", "running")]["status"] == "pass", checks[("daemon", "running")]
    assert url in checks[("daemon", "running")]["detail"]


def test_tls_failures_are_one_line_saying_what_to_do(tls_sim: tuple[Path, str]) -> None:
    _, url = tls_sim
    # no --config, no --ca-file: the self-signed certificate is in no trust store
    r = cli("status", "--url", url, "--auth-user", USER, password=PASSWORD)
    assert r.returncode == EXIT_UNREACHABLE
    (line,) = r.stderr.strip().splitlines()
    assert "TLS: certificate verify failed (self-signed certificate)" in line and "--ca-file" in line
    r = cli("status", "--url", url.replace("https://", "http://"), "--auth-user", USER, password=PASSWORD)
    (line,) = r.stderr.strip().splitlines()
    assert r.returncode == EXIT_UNREACHABLE and line.endswith("use an https:// URL")


def test_probe_never_runs_beside_a_daemon_that_refused_it(tls_sim: tuple[Path, str]) -> None:
    cfg, url = tls_sim
    # an untrusted certificate, and plain HTTP to the TLS port: a daemon answered, so no direct run
    for target, says in ((url, "--ca-file"), (url.replace("https://", "http://"), "use an https:// URL")):
        r = cli("probe", "--url", target, "--auth-user", USER, password=PASSWORD)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "probes run directly" not in r.stdout and says in r.stderr, r.stdout + r.stderr
    r = cli("doctor", "--config", str(cfg), "--json", "--deadline", "10")  # no credentials
    checks = {(c["group"], c["check"]): c for c in json.loads(r.stdout)["checks"]}
    running = checks[("daemon", "running")]
    assert (running["status"], r.returncode) == ("fail", 2), running
    assert "HTTP 401" in running["detail"] and "--auth-user" in running["fix"]
