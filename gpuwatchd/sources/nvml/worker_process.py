"""The NVML worker as an OS process: its environment, spawn in its own session, signals, kill with a grace.

Nothing here knows what the worker says; :mod:`gpuwatchd.sources.nvml.supervisor` reads it. The worker runs in its
own session so a TERM or KILL reaches everything it started, and a blocked C call cannot be cancelled, only killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

LIBRARY_NAME = "libnvidia-ml.so.1"
# One JSON line per poll; 16 GPUs x top-1000 processes is a few MB. Bigger means a broken worker.
MAX_LINE_BYTES = 64 * 1024 * 1024


def library_file(library_path: Path | None) -> Path | None:
    """``nvml.library_path`` names the library or its directory: the library file."""
    if library_path is None:
        return None
    return library_path if library_path.name == LIBRARY_NAME else library_path / LIBRARY_NAME


def child_env(env: Mapping[str, str], library_path: Path | None) -> dict[str, str]:
    """The worker's environment: the configured library first on ``LD_LIBRARY_PATH``, this package importable."""
    out = dict(env)
    lib = library_file(library_path)
    if lib is not None:
        old = out.get("LD_LIBRARY_PATH")
        out["LD_LIBRARY_PATH"] = f"{lib.parent}:{old}" if old else str(lib.parent)
    # The worker imports this package; make that work from a source checkout too.
    pkg_parent = str(Path(__file__).resolve().parents[2])
    old_pp = out.get("PYTHONPATH")
    out["PYTHONPATH"] = f"{pkg_parent}:{old_pp}" if old_pp else pkg_parent
    return out


async def spawn(
    argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = (), *, quiet: bool = False
) -> asyncio.subprocess.Process:
    """Start a worker in a new session, stdin and stdout piped, stderr piped (or discarded: ``quiet``).

    Raises OSError when fork/exec fails."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL if quiet else asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        limit=MAX_LINE_BYTES,
        pass_fds=tuple(pass_fds),
    )


def signal_group(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    if proc is not None and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # own session: the group id is the worker's pid


async def terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """TERM the worker's process group, KILL it after ``grace`` real seconds, and reap it."""
    if proc.returncode is None:
        signal_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except asyncio.TimeoutError:
            signal_group(proc, signal.SIGKILL)
            await proc.wait()


def is_stopped(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): state ``T`` or ``t`` in ``/proc/<pid>/stat``.

    A stopped worker is not evidence against any GPU: it answers again once continued (or is replaced)."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses, so split after its last ')'.
    rest = stat[stat.rfind(")") + 2:]
    return rest[:1] in ("T", "t")
