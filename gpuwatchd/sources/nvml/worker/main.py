"""The NVML worker: ``python -m gpuwatchd.sources.nvml.worker.main '<json options>'``, supervised by the daemon.

The only module (with its helpers in this package) that imports pynvml. It initialises NVML (the session and its GPUs:
:mod:`gpuwatchd.sources.nvml.worker.session`), enumerates GPUs by index (keyed by UUID downstream), then polls every
``interval`` seconds in a poller thread watched by the main one, and writes one JSON line per poll to stdout:
the ``Snapshot`` dict form (the supervisor reads it with ``snapshot_from_dict``).
The first line is ``{"hello": <pid>}``, written before ``nvmlInit`` so the supervisor can time init as part of
the first poll. Logs go to stderr as ``nvml_worker[<pid>] <LEVEL>: <message>`` lines.

Host facts about GPU processes (name, user, RSS) come from psutil; ``main(resolver=...)`` takes another source
(``gpuwatchd.sim.worker`` passes the simulator's, whose pids are fictitious).

Lines, exit codes and the progress word are defined in :mod:`gpuwatchd.sources.nvml.protocol`. A GPU lost or a
changed device count ends the worker with ``EXIT_REENUMERATE``: a long-lived NVML session does not see hot-plug,
so a fresh worker re-enumerates.

Options (JSON object on argv[1]): ``interval`` (real seconds between poll starts), ``top_n`` (processes kept
per GPU), ``library_path`` (the library the supervisor pointed ``LD_LIBRARY_PATH`` at; missing means
``library_not_found``), ``max_polls`` (stop after this many; for tests and bench/poll.py), ``trace_calls``
(count NVML symbol look-ups per poll and add ``"calls"`` to each line; for tests of the capability cache),
``measure_after`` (bench/poll.py: after this many polls, start counting the worker's own CPU time with
``time.process_time()``; at ``max_polls`` log ``measured cpu_seconds=<s> polls=<n>`` at DEBUG),
``progress_fd`` (an inherited 4-byte memfd where the index of the GPU being called is kept, so the supervisor
can say where a worker that missed its deadline was), ``stall_after`` and ``hang_after`` (real seconds: a GPU
whose calls block this long is set aside, reported lost as ``hang_suspected`` and then as ``timeout``, while the
other GPUs keep their schedule; :mod:`gpuwatchd.sources.nvml.worker.stall_watch`), ``only`` (GPU indices: open just
these, for the supervisor's retry of GPUs that hung), ``gpm_min_interval`` (real seconds: GPM samples are taken at
least this far apart, nvml.h's 100 ms refresh rate under the daemon; polls in between repeat the last GPM metrics;
default 0, every poll), ``same_as_last`` (send a process unchanged since the last line as its bare pid:
``protocol.SameAsLast``; the daemon's supervisor sets it, other readers of the lines leave it off),
``static_refresh_seconds`` (real seconds: what a board is rather than what it does, ``readings.STATIC_READINGS``,
is read when a GPU is opened and again after this long, its last values sent in between; default 60, 0 reads
them every poll). Commands come on stdin (``worker_protocol``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import pynvml as N

from gpuwatchd.sources.nvml.protocol import (
    EXIT_INIT_FAILED,
    EXIT_REENUMERATE,
    EXIT_STOPPED,
    HELLO,
    RELEASE,
    SAME_AS_LAST,
    SameAsLast,
    encode_line,
)
from gpuwatchd.sources.nvml.worker.errors import reason
from gpuwatchd.sources.nvml.worker.gpm import GpmSampler
from gpuwatchd.sources.nvml.worker.processes import ProcResolver
from gpuwatchd.sources.nvml.worker.readings import STATIC_REFRESH_SECONDS, worker_log
from gpuwatchd.sources.nvml.worker.session import DEFAULT_HANG_AFTER_SECONDS, Worker
from gpuwatchd.sources.nvml.worker.stall_watch import Position, watch

TYPE_CHECKING = False  # typing.TYPE_CHECKING, which mypy reads the same, without importing typing (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any

    from gpuwatchd.sources.nvml.worker.processes import Resolver

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# When the supervisor does not say (tests, bench): a GPU whose call blocks this long (real seconds) is set aside.
DEFAULT_STALL_AFTER_SECONDS = 0.25


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when the daemon dies, even while blocked inside a hung NVML call."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(encode_line(obj))
    sys.stdout.flush()


class _CallCounter:
    """Counts NVML symbol look-ups (one per pynvml call) by wrapping pynvml's own pointer accessor."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._orig = N._nvmlGetFunctionPointer
        N._nvmlGetFunctionPointer = self._lookup

    def _lookup(self, name: str) -> Any:
        self.counts[name] = self.counts.get(name, 0) + 1
        return self._orig(name)

    def take(self) -> dict[str, int]:
        out, self.counts = self.counts, {}
        return out


class _Runner:
    """The poll schedule, shared by the poller threads (one current generation at a time), and the exit code."""

    def __init__(self, worker: Worker, opts: dict[str, Any], counter: _CallCounter | None) -> None:
        self.worker = worker
        self.interval = float(opts.get("interval", 1.0))
        self.max_polls: int | None = opts.get("max_polls")
        # Off (None) in the daemon: one comparison per poll. CPU time of this process, precise (not tick-based).
        self.measure_after: int | None = opts.get("measure_after")
        self.counter = counter
        self.same_as_last = SameAsLast() if opts.get(SAME_AS_LAST) else None
        self.parent = os.getppid()
        self.polls = 0
        self.cpu0 = 0.0
        self.done = threading.Event()
        self.next_start: float | None = None  # time.monotonic() the poller plans to start its next poll
        self.code = EXIT_STOPPED
        self._emit_lock = threading.Lock()

    def start(self, pos: Position) -> None:
        threading.Thread(target=self.loop, args=(pos,), name=f"poller-{pos.gen}", daemon=True).start()

    def loop(self, pos: Position) -> None:
        worker = self.worker
        while True:
            if self.polls == self.measure_after:
                self.cpu0 = time.process_time()
            started = time.monotonic()
            snap = worker.poll(pos)
            if snap is None:
                return  # set aside: the current poller carries on
            if self.counter is not None:
                snap["calls"] = self.counter.take()
            with self._emit_lock:
                if pos.gen != worker.gen:
                    return
                _emit(snap if self.same_as_last is None else self.same_as_last.encode(snap))
                self.polls += 1
            code = self._after_poll()
            if code is not None:
                self.code = code
                self.done.set()
                self.worker.activity.set()  # wakes the stall watch sleeping between polls
                return
            pause = max(0.0, self.interval - (time.monotonic() - started))
            self.next_start = time.monotonic() + pause  # the stall watch sleeps until then (stall_watch.watch)
            time.sleep(pause)
            if pos.gen != worker.gen:
                return

    def _after_poll(self) -> int | None:
        if self.worker.reenumerate is not None:
            worker_log(f"exiting for a fresh enumeration: {self.worker.reenumerate}")
            return EXIT_REENUMERATE
        if self.max_polls is not None and self.polls >= self.max_polls:
            if self.measure_after is not None:
                cpu = time.process_time() - self.cpu0
                worker_log(f"measured cpu_seconds={cpu:.9f} polls={self.polls - self.measure_after}", "DEBUG")
            return EXIT_STOPPED
        if os.getppid() != self.parent:
            return EXIT_STOPPED
        return None

    def set_aside(self, pos: Position, blocked: float) -> None:
        new = self.worker.set_aside(pos, blocked)
        if new is not None:
            self.start(new)


def _read_commands(worker: Worker) -> None:
    """The supervisor's lines on stdin (worker_protocol); EOF or garbage ends the reading, not the worker."""
    try:
        for line in sys.stdin:
            for index in json.loads(line).get(RELEASE, ()):
                worker.release(int(index))
    except (ValueError, TypeError, AttributeError, OSError) as e:
        worker_log(f"unreadable command from the supervisor: {e!r}", "WARNING")


def run(opts: dict[str, Any], resolver: Resolver) -> int:
    """Worker main: init, then polls in a poller thread while this thread watches for blocked calls."""
    counter = _CallCounter() if opts.get("trace_calls") else None
    _emit({HELLO: os.getpid()})
    hang_after = float(opts.get("hang_after", DEFAULT_HANG_AFTER_SECONDS))
    stall_after = min(float(opts.get("stall_after", DEFAULT_STALL_AFTER_SECONDS)), hang_after)
    only = {int(i) for i in opts["only"]} if opts.get("only") is not None else None
    GpmSampler.min_interval = float(opts.get("gpm_min_interval", 0.0))
    worker = Worker(int(opts.get("top_n", 10)), resolver, progress_fd=opts.get("progress_fd"), hang_after=hang_after,
                    only=only, static_refresh=float(opts.get("static_refresh_seconds", STATIC_REFRESH_SECONDS)))
    library = opts.get("library_path")
    try:
        if library is not None and not os.path.exists(library):
            # A configured library that is missing must not silently fall back to whatever the system has.
            raise N.NVMLError(N.NVML_ERROR_LIBRARY_NOT_FOUND)
        worker.start()
    except N.NVMLError as e:
        why = reason(e.value)
        # DEBUG: the daemon reports an outage once (gpuwatchd.runtime.nvml_outage), not once per retry.
        worker_log(f"nvmlInit failed: {why} ({e}){f' [{library}]' if library else ''}", "DEBUG")
        _emit({"timestamp": time.time(), "nvml_ok": False, "nvml_error": why})
        return EXIT_INIT_FAILED
    runner = _Runner(worker, opts, counter)
    threading.Thread(target=_read_commands, args=(worker,), name="commands", daemon=True).start()
    runner.start(worker.pos)
    watch(lambda: worker.pos, lambda: worker.stuck, runner.set_aside, runner.done, stall_after,
          activity=worker.activity, next_start=lambda: runner.next_start)
    if worker.stuck:
        # A thread is still inside a blocked NVML call: nvmlShutdown could block behind it, and interpreter
        # shutdown would wait on nothing useful. The snapshot lines are flushed; leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(runner.code)
    worker.close()
    return runner.code


def main(argv: list[str] | None = None, resolver: Callable[[], Resolver] = ProcResolver) -> int:
    """``python -m gpuwatchd.sources.nvml.worker.main '<json options>'``; ``resolver`` makes the host-facts source."""
    argv = sys.argv[1:] if argv is None else argv
    opts = json.loads(argv[0]) if argv else {}
    _die_with_parent()
    # SIGPIPE default: the daemon closing our stdout ends us quietly instead of a BrokenPipeError traceback.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return run(opts, resolver())


if __name__ == "__main__":
    sys.exit(main())
