"""Run ``gpuwatchd <args>`` many times without paying the interpreter and import start-up each time.

A server process imports the CLI once, then forks one child per case: the child is a real process (its own
stdout/stderr files, stdin /dev/null, exit code, interpreter shutdown with atexit and garbage collection), so a
crash, a traceback or a hang is seen exactly as with ``python -m gpuwatchd``; only the imports are shared. A child
still running at the deadline is killed (-9), as ``subprocess.run(timeout=)`` would be told apart by the caller.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

SERVER = r"""
import json, os, sys, time
from gpuwatchd.cli.commands import main

for line in sys.stdin:
    req = json.loads(line)
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
    deadline = time.monotonic() + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class CliForks:
    """One server; ``run`` is one case at a time (use one instance per thread)."""

    def __init__(self, env: Mapping[str, str], cwd: Path, timeout: float) -> None:
        self.timeout = timeout
        self.dir = tempfile.TemporaryDirectory(prefix="gpuwatchd-cli-forks-")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(env), cwd=cwd)  # fmt: skip
        self.n = 0

    def run(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        out, err = Path(self.dir.name, f"{self.n}.out"), Path(self.dir.name, f"{self.n}.err")
        req = {"args": list(args), "out": str(out), "err": str(err), "timeout": self.timeout}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the CLI fork server ended (exit {self.proc.poll()}) on {args}"
        rc = json.loads(line)["rc"]
        read = {"encoding": "utf-8", "errors": "replace"}
        return subprocess.CompletedProcess(args, rc, out.read_text(**read), err.read_text(**read))

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()  # EOF on stdin ends the server
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()
