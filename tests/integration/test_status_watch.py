"""``gpuwatchd status --watch`` through a real pseudo-terminal (pexpect) against real sims: it shows the leaking
process with its time to full, redraws in place, says when the daemon stops answering and picks up the new one
after a restart, and exits 0 on Ctrl-C; on a pipe whose reader goes away it ends quietly (141, no traceback)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pexpect
import pytest
import yaml
from support import ROOT, START_SECONDS, DaemonProcess, free_port, wait_until
from tls_files import TlsFiles

from gpuwatchd.runtime.daemon_client import PASSWORD_ENV
from gpuwatchd.runtime.exitcodes import EXIT_BROKEN_PIPE, EXIT_UNREACHABLE

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "50"}
WAIT = 120  # seconds: a liveness bound on a loaded 2-core machine, not a timing claim
SIM_START = 180.0  # a sim's start beside other jobs (30 s was seen to pass with a load average of 33)
pytestmark = pytest.mark.timeout(600)  # a sim's start and a terminal's frames, beyond the suite's 120 s when loaded
SGR = r"(?:\x1b\[[0-9;]*m)*"  # colour codes rich puts around a state


def silence(url: str, alertname: str) -> None:
    """A silence through the daemon's API (loopback may write), as a user's script would make it."""
    body = json.dumps({"matchers": [{"name": "alertname", "value": alertname, "isRegex": False, "isEqual": True}],
                       "createdBy": "test", "comment": "known leak, fix deployed tomorrow"}).encode()
    req = urllib.request.Request(f"{url}/api/v1/silences", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def start_sim(tmp: Path, port: int, *args: str) -> DaemonProcess:
    log_path = tmp / f"sim-{port}-{len(list(tmp.iterdir()))}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", tmp / "unused.yml", log_path)

    def ready() -> bool:
        assert proc.poll() is None, f"sim exited with {proc.returncode}:\n{d.log()}"
        try:
            return d.get("/readyz", timeout=1)[0] == 200
        except OSError:
            return False

    wait_until(ready, "gpuwatchd sim to serve", START_SECONDS)
    return d


def stop(d: DaemonProcess) -> None:
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def sims() -> Iterator[list[DaemonProcess]]:
    running: list[DaemonProcess] = []
    yield running
    for d in running:
        stop(d)


def test_watch_in_a_terminal_survives_a_restart_and_quits_on_ctrl_c(tmp_path: Path,
                                                                      sims: list[DaemonProcess]) -> None:
    port = free_port()
    sims.append(start_sim(tmp_path, port, "--scenario", "leak", "--speed", "30"))
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatchd", "status", "--watch", "0.5", "--url",
                                           f"http://127.0.0.1:{port}"], cwd=str(ROOT), env=ENV,
                          dimensions=(50, 160), timeout=WAIT, encoding="utf-8", codec_errors="replace")
    try:
        child.expect("CLOCKS")  # the GPU table's header: clocks, P-state, link, throttle reasons, probe
        child.expect(r"4242\s+alice\s+python")
        # The leak rule suspects pid 4242 ~5 min of scenario time in (10 s at 30x): the view gives its time to full.
        child.expect(r"(pending|firing): full in \d+")
        child.expect(f"GpuMemoryLeak\\s+{SGR}firing")
        seen = child.before + child.after
        # Redrawn in place: rich moves the cursor up over the previous frame instead of scrolling a new one.
        child.expect("every 0.5s")
        assert "\x1b[1A" in child.before or "\x1b[1A" in seen
        # A silenced alert says so, here and in the one-shot `status` (it said "firing").
        silence(sims[0].url, "GpuMemoryLeak")
        child.expect(f"GpuMemoryLeak\\s+{SGR}silenced")
        once = subprocess.run([sys.executable, "-m", "gpuwatchd", "status", "--url", sims[0].url], cwd=ROOT, env=ENV,
                              capture_output=True, text=True, timeout=60, check=True)
        row = next(line for line in once.stdout.splitlines() if line.startswith("GpuMemoryLeak"))
        assert re.search(r"\bsilenced\b", row) and "firing" not in row, row
        # The daemon goes away: the last picture stays, under a line that says so; a new daemon is picked up.
        stop(sims.pop())
        child.expect("daemon not answering")
        sims.append(start_sim(tmp_path, port, "--scenario", "dock-unauthorized"))
        child.expect(r"boltctl enroll c6030000-0062-0c0e-8328-a0e1c2a5f30b")
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in (child.before or "")


def test_watch_on_a_closed_pipe_ends_quietly(tmp_path: Path, sims: list[DaemonProcess]) -> None:
    port = free_port()
    sims.append(start_sim(tmp_path, port, "--scenario", "idle"))
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "status", "--watch", "0.2", "--url",
                             f"http://127.0.0.1:{port}"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline() + proc.stdout.readline()
        assert b"gpuwatchd" in first  # on a pipe each refresh is a new frame, headed by a rule with the time
        proc.stdout.close()  # the reader goes away (`| head`)
        code = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert code == EXIT_BROKEN_PIPE, err
    assert "Traceback" not in err and "Exception" not in err


def test_watch_a_daemon_behind_tls_and_basic_auth(tmp_path: Path, sims: list[DaemonProcess],
                                                  tls_files: TlsFiles) -> None:
    """Remote-style: https, the daemon's certificate as --ca-file, the password from $GPUWATCHD_PASSWORD; a wrong
    password ends the view at once with what to pass (exit 3), not a retry loop."""
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tls_files.cert), "key_file": str(tls_files.key)},
        "basic_auth_users": {"ops": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()},
    }))  # fmt: skip
    port = free_port()
    log_path = tmp_path / "tls-sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", "sim", "--gpus", "2", "--listen",
                                 f"127.0.0.1:{port}", "--web.config.file", str(web)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)  # fmt: skip
    sims.append(DaemonProcess(proc, f"https://127.0.0.1:{port}", tmp_path / "unused.yml", log_path))
    args = ["-m", "gpuwatchd", "status", "--watch", "1", "--url", f"https://127.0.0.1:{port}",
            "--ca-file", str(tls_files.cert), "--auth-user", "ops"]
    child = pexpect.spawn(sys.executable, args, cwd=str(ROOT), env={**ENV, PASSWORD_ENV: "s3cret"},
                          dimensions=(50, 160), timeout=WAIT, encoding="utf-8", codec_errors="replace")
    try:
        child.expect(r"0    NVIDIA RTX A5000(.|\n)*?1    NVIDIA RTX A5000")  # both GPUs, once the sim serves
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    wrong = subprocess.run([sys.executable, *args], cwd=ROOT, env={**ENV, PASSWORD_ENV: "nope"}, capture_output=True,
                           text=True, timeout=60, check=False)
    assert wrong.returncode == EXIT_UNREACHABLE
    assert "HTTP 401" in wrong.stderr and "--auth-user" in wrong.stderr and "Traceback" not in wrong.stderr


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/api/v1/status", timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def test_status_and_watch_during_an_egpu_removal_show_one_gpu_0(tmp_path: Path, sims: list[DaemonProcess]) -> None:
    """egpu-unplug: the eGPU (index 0) is removed and NVML gives index 0 to the internal A2000. Both views list the
    gone eGPU as "was 0" (a gone GPU's index is history), never two rows saying 0."""
    port = free_port()
    sims.append(start_sim(tmp_path, port, "--scenario", "egpu-unplug", "--speed", "2"))
    url = sims[0].url

    def removed() -> bool:
        gpus = {g["name"]: g for g in _status(url)["gpus"]}
        egpu, internal = gpus["NVIDIA GeForce RTX 3090"], gpus["NVIDIA RTX A2000 12GB"]
        return egpu["state"] == "removed" and internal["index"] == 0

    wait_until(removed, "the eGPU removed and the A2000 at index 0", timeout=WAIT)
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatchd", "status", "--watch", "0.5", "--url", url], cwd=str(ROOT),
                          env=ENV, dimensions=(50, 160), timeout=WAIT, encoding="utf-8", codec_errors="replace")
    try:
        child.expect(r"was 0\s+NVIDIA GeForce RTX 3090")
        child.expect(r"was GPU 0: \S*unhealthy")  # its health note says which GPU: the gone one
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    once = subprocess.run([sys.executable, "-m", "gpuwatchd", "status", "--url", url], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60, check=True)
    rows = [line.split()[:2] for line in once.stdout.splitlines() if "NVIDIA" in line and "GPU-" in line]
    if ["0", "NVIDIA"] in rows and ["was", "0"] not in rows:  # replugged since (index 1): nothing left to show
        assert not removed(), once.stdout
    else:
        assert rows.count(["0", "NVIDIA"]) == 1 and ["was", "0"] in rows, once.stdout


def test_watch_has_the_owner_column(tmp_path: Path, sims: list[DaemonProcess]) -> None:
    """The attribution scenario without a kubelet: owners from each process' cgroup, as the page's Owner column."""
    port = free_port()
    sims.append(start_sim(tmp_path, port, "--scenario", "attribution"))

    def owners() -> bool:
        procs = {p["pid"]: p for g in _status(sims[0].url)["gpus"] for p in g["processes"]}
        return 7301 in procs and bool((procs[7301].get("owner") or {}).get("hpc_job"))

    wait_until(owners, "the attribution of pid 7301", timeout=WAIT)
    # A tall terminal: the live view cuts what does not fit (4 GPUs, 2 MIG devices, 8 processes, the alerts).
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatchd", "status", "--watch", "1", "--url", sims[0].url],
                          cwd=str(ROOT), env={**ENV, "LINES": "100"}, dimensions=(100, 160), timeout=WAIT,
                          encoding="utf-8", codec_errors="replace")
    try:
        gap = r"(?:\s|\x1b\[[0-9;]*m)+"  # spaces and the colour codes rich puts around cells
        child.expect(gap.join(["PID", "USER", "PROCESS", "OWNER"]))
        child.expect(gap.join(["4242", "alice", "python", "container 8d1e4b2a9f3c"]))
        child.expect(gap.join(["7301", "erin", "python", "job 4242"]))
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
