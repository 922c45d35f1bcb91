"""Run ``gpuwatchd <args>`` as a real process and measure it: exit code, output, peak memory (the child's own
``ru_maxrss`` from ``wait4``), wall time. The hostile-input tests bound memory with it, not with timed assertions:
a replay that fills an 11-day gap densely shows up as GiBs, far above any bound here, however busy the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from cli_forks import Measured


def run_measured(args: tuple[str, ...], *, env: Mapping[str, str], cwd: Path, timeout: float,
                 until_stdout: str | None = None) -> Measured:
    """``python -m gpuwatchd *args``; killed (SIGINT, then SIGKILL) after ``timeout`` s, or once ``until_stdout``
    appears in its output (a sim that serves: the test only needs to know it got that far)."""
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-measured-") as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        start = time.monotonic()
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen([sys.executable, "-m", "gpuwatchd", *args], stdout=fo, stderr=fe,
                                    stdin=subprocess.DEVNULL, cwd=cwd, env=dict(env))  # fmt: skip
        deadline = start + timeout
        killed = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now = time.monotonic()
            if until_stdout is not None and until_stdout in out.read_text(errors="replace"):
                deadline = min(deadline, now)
            if now >= deadline and not killed:
                killed = True
                proc.send_signal(signal.SIGINT)
                deadline = now + 30
            elif now >= deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        rc = None if killed else proc.returncode
        read = {"encoding": "utf-8", "errors": "replace"}
        return Measured(args, rc, out.read_text(**read), err.read_text(**read), usage.ru_maxrss / 1024,
                        time.monotonic() - start)  # fmt: skip


def one_line_error(m: Measured) -> list[str]:
    """What is wrong with ``m`` as a refusal of bad input: it must exit non-zero with one ``where: message`` line
    on stderr and no traceback."""
    why = []
    lines = [line for line in m.stderr.strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("usage: "):  # argparse: its usage block, then the one error line
        lines = [line for line in lines if not line.startswith((" ", "usage: "))]
    if m.rc is None:
        why.append("still running at the deadline")
    elif m.rc == 0:
        why.append("exit 0")
    if "Traceback" in m.stdout + m.stderr:
        why.append("traceback")
    if len(lines) != 1:
        why.append(f"{len(lines)} stderr lines, not 1")
    elif ": " not in lines[0]:
        why.append("a line without 'where: message'")
    return why
