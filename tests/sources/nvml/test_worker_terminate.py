"""worker_process.terminate: a worker that has its grace is still killed and reaped when the wait is cancelled."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from gpuwatchd.sources.nvml import worker_process

# A stand-in for a worker that does not end on TERM within its grace (a worker blocked in a GPU call ends on TERM
# at once; one that ignores it shows what a cancel during the grace did): says it is ready, then sleeps.
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(120)")


async def test_a_cancel_during_the_grace_kills_and_reaps_then_passes_on() -> None:
    """The supervisor cancels a retry task whose worker is being terminated when the daemon stops: the worker must
    not outlive that (before, the cancel left it running after the loop closed)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", STUBBORN, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
    task = asyncio.create_task(worker_process.terminate(proc, grace=60.0))
    await asyncio.sleep(0.2)  # TERM sent and ignored: in the grace
    assert proc.returncode is None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert proc.returncode == -signal.SIGKILL  # killed and reaped


async def test_a_worker_that_ends_on_term_is_reaped_within_the_grace() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(120)",
                                                start_new_session=True)
    await asyncio.wait_for(worker_process.terminate(proc, grace=60.0), 30)
    assert proc.returncode == -signal.SIGTERM
