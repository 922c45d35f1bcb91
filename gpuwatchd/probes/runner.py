"""Run one probe worker: own process group, one GPU by UUID, hard deadline, bounded output, no orphans.

The worker is ``python -m gpuwatchd.probes.worker``; it asks the kernel to SIGKILL it when its parent dies
(PR_SET_PDEATHSIG) and exits at once if the parent is already gone (``PARENT_ENV``), so a daemon killed
mid-probe leaves nothing behind. At the deadline, or when the caller cancels (a user's job started), the whole
process group is killed: a hung CUDA call cannot outlive it. Stdout must be one JSON line of at most
``MAX_STDOUT`` bytes; stderr is logged once per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

PARENT_ENV = "GPUWATCHD_PROBE_PARENT"
MAX_STDOUT = 1 << 20  # a result is a few KiB; more is not a result
MAX_STDERR_LOGGED = 4000
CANCEL_POLL_S = 0.2
REAP_TIMEOUT_S = 30.0  # after SIGKILL; generous for a loaded machine, a bound only so a stop never hangs

Outcome = Literal["ok", "timeout", "crash", "cancelled"]


@dataclass(frozen=True, slots=True)
class WorkerRun:
    outcome: Outcome
    result: dict[str, Any] | None
    detail: str  # what went wrong, one line (empty when ok)
    seconds: float
    returncode: int | None
    pid: int


def worker_env(base: Mapping[str, str], uuid: str | None) -> dict[str, str]:
    env = dict(base)
    if uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = uuid  # by UUID: indices move when docks come and go
    env[PARENT_ENV] = str(os.getpid())
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_worker(argv: Sequence[str], env: Mapping[str, str], deadline: float,
                     cancel: asyncio.Event | None = None, on_start: Any = None) -> WorkerRun:
    """Run ``argv`` to completion, the deadline (wall seconds) or ``cancel``; never raises for worker faults."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(env), start_new_session=True,
    )
    if on_start is not None:
        on_start(proc.pid)
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.ensure_future(_read_capped(proc.stdout, MAX_STDOUT))
    err_task = asyncio.ensure_future(_read_capped(proc.stderr, MAX_STDOUT))
    wait_task = asyncio.ensure_future(proc.wait())
    cancel_task = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    waiting = {wait_task} | ({cancel_task} if cancel_task else set())
    stopped: Outcome | None = None
    try:
        done, _ = await asyncio.wait(waiting, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        if wait_task not in done:
            stopped = "cancelled" if cancel_task is not None and cancel_task in done else "timeout"
        # The group, even after a clean exit: a probe must leave no helper process running.
        _kill_group(proc.pid)
        await wait_task
    except BaseException:
        # Cancelled (the daemon is stopping): the group goes with us, and so do the pipe readers.
        _kill_group(proc.pid)
        for t in (out_task, err_task):
            t.cancel()
        # Reap it (SIGKILL is prompt): a Popen dropped unreaped warns "still running" in whatever runs at the next
        # GC, and the child watcher's exit report is lost once the loop closes. A second cancel must not skip it.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({wait_task}, timeout=REAP_TIMEOUT_S)
        wait_task.cancel()
        # With its readers cancelled the pipes are never drained, so asyncio would not close the transport itself
        # (it does once both pipes hit EOF and the process exited); close it here so nothing is left to the GC.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
        raise
    finally:
        if cancel_task is not None:
            cancel_task.cancel()
    stdout, _ = await out_task
    stderr, _ = await err_task
    seconds = time.monotonic() - t0
    rc = proc.returncode
    text = stderr.decode("utf-8", "replace").strip()
    if text:
        log.warning("probe worker[%d] wrote to stderr:\n%s", proc.pid, text[-MAX_STDERR_LOGGED:])
    if stopped == "timeout":
        return WorkerRun("timeout", None, f"did not finish within its {deadline:g} s deadline and was killed",
                         seconds, rc, proc.pid)
    if stopped == "cancelled":
        return WorkerRun("cancelled", None, "killed: a job started on the GPU", seconds, rc, proc.pid)
    result, problem = parse_output(stdout, rc, text, seconds)
    if result is None:
        return WorkerRun("crash", None, problem, seconds, rc, proc.pid)
    return WorkerRun("ok", result, "", seconds, rc, proc.pid)


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read to EOF keeping at most ``cap`` bytes (the rest is drained, so the child never blocks on a pipe)."""
    kept = bytearray()
    over = False
    while chunk := await stream.read(65536):
        room = cap + 1 - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(kept) > cap:
            over = True
    return bytes(kept), over


def parse_output(stdout: bytes, returncode: int | None, stderr: str, seconds: float | None = None
                 ) -> tuple[dict[str, Any] | None, str]:
    """The worker's result, or why there is none: one line for the alert saying what happened (the signal, the
    exit status, the exception that ended it), never merely the last line of stderr, which is often an unrelated
    warning (torch prints several on import)."""
    after = f" after {seconds:.1f} s" if seconds is not None else ""
    if returncode is not None and returncode < 0:
        return None, f"crashed: killed by {_signal_text(-returncode)}{after}" + _cause(stderr)
    if returncode:
        return None, f"crashed: exited with status {returncode}{after}" + _cause(stderr)
    if len(stdout) > MAX_STDOUT:
        return None, f"printed more than {MAX_STDOUT} bytes instead of one result line"
    text = stdout.decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None, f"exited (status 0){after} without printing a result" + _cause(stderr)
    if not text.endswith("\n"):
        return None, f"printed a truncated result line ({len(stdout)} bytes, no newline)"
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None, f"printed output that is not a probe result: {lines[-1][:80]!r}"
    if not isinstance(data, dict) or data.get("v") != 1:
        return None, f"printed output that is not a probe result: {lines[-1][:80]!r}"
    if len(lines) > 1:
        log.warning("probe worker printed %d extra line(s) before its result: %r", len(lines) - 1, lines[0][:200])
    return data, ""


def _signal_text(num: int) -> str:
    """``SIGSEGV (segmentation fault)``; ``signal 77`` for a number the platform does not name."""
    try:
        name = signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
    desc = signal.strsignal(num)
    return f"{name} ({desc[0].lower() + desc[1:]})" if desc else name


# The line that says why a Python process ended: the exception line closing a traceback, or CPython's fatal error.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure)\b(?::.*)?$")
_FATAL = re.compile(r"^Fatal Python error: .+")


def _cause(stderr: str) -> str:
    """``": RuntimeError: CUDA error: ..."`` when stderr holds a traceback or a fatal error, else nothing."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if _FATAL.match(ln):
            return f": {ln[:160]}"
        if _EXCEPTION.match(ln) and any(x.startswith("Traceback (most recent call last)") for x in lines[:i]):
            return f": {ln[:160]}"
    return ""
