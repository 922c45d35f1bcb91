"""The NVML worker as an OS process: its environment, spawn in its own session, signals, kill with a grace.

Nothing here knows what the worker says; :mod:`gpuwatchd.sources.nvml.supervisor` reads it. The worker runs in its
own session so a TERM or KILL reaches everything it started, and a blocked C call cannot be cancelled, only killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
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


# Third-party modules the worker imports (gpuwatchd itself is found through its own directory): pynvml, and psutil
# for the host facts of GPU processes (sources/nvml/worker/processes.py).
WORKER_IMPORTS = ("pynvml", "psutil")


def worker_argv(python: str, module: str) -> list[str]:
    """How a worker module is started: without ``site`` (``-S``). ``site`` (the site-packages scan, every ``.pth``
    file, sitecustomize) is ~5 MB of a worker's RSS and none of its work; :func:`import_path` hands the worker
    the directories ``site`` would have found, through ``PYTHONPATH`` (which ``-S`` still reads)."""
    return [python, "-S", "-m", module]


def import_path(modules: Sequence[str] = WORKER_IMPORTS, search: Sequence[str] | None = None) -> list[str]:
    """The directories a ``-S`` worker needs on ``sys.path``, in order: the one holding this package (a source
    checkout, a site-packages, an editable install's project directory alike); the one each of ``modules`` is
    found in by this interpreter, whatever found it (a ``.pth`` line, an editable install's finder hook, which a
    ``-S`` interpreter would not have); then every directory of this interpreter's ``sys.path`` (``search``),
    which holds what ``.pth`` files added. Nothing is imported to find them."""
    out = [str(Path(__file__).resolve().parents[3])]
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None and os.path.isabs(spec.origin):
            # a package's origin is <dir>/<name>/__init__.py, a module's <dir>/<name>.py (or .so)
            out.append(os.path.dirname(os.path.dirname(spec.origin)) if spec.submodule_search_locations is not None
                       else os.path.dirname(spec.origin))
    # The standard library's own directories the child finds by itself (and must find its own, not ours).
    stdlib = os.path.dirname(os.__file__)
    own = {stdlib, os.path.join(stdlib, "lib-dynload")}
    out.extend(p for p in (sys.path if search is None else search) if p and p not in own and os.path.exists(p))
    return list(dict.fromkeys(out))


def child_env(env: Mapping[str, str], library_path: Path | None, *,
              modules: Sequence[str] = WORKER_IMPORTS) -> dict[str, str]:
    """The worker's environment: the configured library first on ``LD_LIBRARY_PATH``; on ``PYTHONPATH`` what a
    ``-S`` worker needs to import ``modules`` and this package (:func:`import_path`), then what ``env`` had there."""
    out = dict(env)
    lib = library_file(library_path)
    if lib is not None:
        old = out.get("LD_LIBRARY_PATH")
        out["LD_LIBRARY_PATH"] = f"{lib.parent}:{old}" if old else str(lib.parent)
    parts = import_path(modules)
    old_pp = out.get("PYTHONPATH")
    if old_pp:
        parts.extend(p for p in old_pp.split(os.pathsep) if p not in parts)
    out["PYTHONPATH"] = os.pathsep.join(parts)
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
    """TERM the worker's process group, KILL it after ``grace`` real seconds, and reap it.

    Cancelled during the grace (the daemon stopping while a retry worker ends: the supervisor cancels the retry
    task, whose ``finally`` is here), it KILLs and reaps at once and then lets the cancel through: a worker left
    running, possibly blocked in a GPU call, outlived the daemon's loop before."""
    if proc.returncode is None:
        signal_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except asyncio.TimeoutError:
            signal_group(proc, signal.SIGKILL)
            await proc.wait()
        except asyncio.CancelledError:
            signal_group(proc, signal.SIGKILL)
            await proc.wait()
            raise


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
