"""Run many short ``gpuwatchd <args>`` commands without paying the interpreter start and the imports each time.

A server process imports the CLI (and what doctor and sim import on their way) once, then forks one child per
command: the child is a real process (its own stdout/stderr files, stdin /dev/null, exit code, interpreter shutdown
with atexit and garbage collection), so a crash, a traceback or a hang is seen exactly as with ``python -m
gpuwatchd``; only the imports are shared. Each child is measured with ``wait4`` (peak RSS, wall time); one still
running at the deadline is killed (-9) and reported with ``rc`` None. The one fork server of the hostile-input
tests (tests/config, tests/integration).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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
