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
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    args: tuple[str, ...]
    rc: int | None  # None: killed at the deadline (a hang, or a command that serves: see ``expect_serving``)
    stdout: str
    stderr: str
    max_rss_mib: float
    wall_s: float

    def describe(self) -> str:
        return (f"gpuwatchd {' '.join(a if len(a) < 80 else a[:60] + '...' for a in self.args)}: exit {self.rc}, "
                f"{self.max_rss_mib:.0f} MiB, {self.wall_s:.1f} s; stderr: {self.stderr[-800:]!r}")


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


SERVER = r"""
import json, os, sys, time
from gpuwatchd.cli.commands import main
# what doctor and sim import on their way: paid once here, not in every child
import aiohttp, gpuwatchd.doctor.run, gpuwatchd.sim.runner, gpuwatchd.sim.csv_replay, gpuwatchd.sim.capture

for line in sys.stdin:
    req = json.loads(line)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, name in ((1, req["out"]), (2, req["err"])):
            f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(os.devnull)
        sys.argv = ["gpuwatchd", *req["args"]]
        sys.exit(main(req["args"]))
    deadline = start + req["timeout"]
    killed = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            killed = True
            os.kill(pid, 9)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    rc = None if killed else os.waitstatus_to_exitcode(status)
    print(json.dumps({"rc": rc, "rss": usage.ru_maxrss / 1024, "wall": time.monotonic() - start}), flush=True)
"""


class ForkRunner:
    """Many short ``gpuwatchd`` commands without paying the interpreter start and the imports each time: one
    server imports the CLI, then forks a real child process per command (its own stdout/stderr, exit code,
    interpreter shutdown) and measures it with ``wait4``. One command at a time per runner."""

    def __init__(self, env: Mapping[str, str], cwd: Path, timeout: float) -> None:
        self.timeout = timeout
        self.dir = tempfile.TemporaryDirectory(prefix="gpuwatchd-fork-runner-")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(env), cwd=cwd)  # fmt: skip
        self.n = 0

    def run(self, args: tuple[str, ...]) -> Measured:
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        out, err = Path(self.dir.name, f"{self.n}.out"), Path(self.dir.name, f"{self.n}.err")
        self.proc.stdin.write(json.dumps({"args": list(args), "out": str(out), "err": str(err),
                                          "timeout": self.timeout}) + "\n")  # fmt: skip
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the fork server ended (exit {self.proc.poll()}) on {args}"
        res = json.loads(line)
        read = {"encoding": "utf-8", "errors": "replace"}
        return Measured(args, res["rc"], out.read_text(**read), err.read_text(**read), res["rss"], res["wall"])

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


class ForkPool:
    """``servers`` fork servers (the machine's 2 cores) for a whole test module: the imports are paid once."""

    def __init__(self, env: Mapping[str, str], cwd: Path, timeout: float, servers: int = 2) -> None:
        self.runners = [ForkRunner(env, cwd, timeout) for _ in range(servers)]

    def run_all(self, cases: list[tuple[str, ...]]) -> list[Measured]:
        """Each of ``cases`` as a forked child, spread over the servers; results in the order of ``cases``."""
        from concurrent.futures import ThreadPoolExecutor

        n = len(self.runners)
        chunks = [cases[i::n] for i in range(n)]
        with ThreadPoolExecutor(max_workers=n) as pool:
            done = list(pool.map(lambda rc: [rc[0].run(c) for c in rc[1]], zip(self.runners, chunks, strict=True)))
        out: list[Measured] = [None] * len(cases)  # type: ignore[list-item]
        for i, res in enumerate(done):
            for j, m in enumerate(res):
                out[i + j * n] = m
        return out

    def close(self) -> None:
        for r in self.runners:
            r.close()
