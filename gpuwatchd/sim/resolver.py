"""Host facts of the stand-in's fictitious GPU processes, read from the sim state (the worker's resolver under sim).

The NVML worker takes a process resolver (:class:`gpuwatchd.sources.nvml.worker.processes.Resolver`); in production
it is psutil (``ProcResolver``). Under the stand-in driver the pids do not exist on the host, so
``gpuwatchd.sim.worker`` hands the worker this one instead, which reads name, user and RSS from the same state file
the stand-in serves.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.state import read_state
from gpuwatchd.sources.nvml.worker.processes import GONE, HIDDEN, LIVE, UNKNOWN, HostState, ProcInfo

# (message, level name): how the resolver reports trouble; the worker passes its stderr line writer.
Log = Callable[[str, str], None]


def _default_log(msg: str, level: str) -> None:
    logging.getLogger(__name__).log(logging.getLevelName(level), msg)


class SimResolver:
    """Host facts from the stand-in's state file (its pids are fictitious); re-read only when the file changes.

    A file that cannot be parsed (torn write, hand-edited garbage) keeps the last good names: losing process
    names is worse than showing ones a moment old, and a traceback would end the worker. It is logged once per
    run of bad files and retried only when the file changes again.
    """

    def __init__(self, path: Path, log: Log | None = None) -> None:
        self.path = path
        self._log = log or _default_log
        self._stamp: tuple[int, int, int] | None = None
        self._by_pid: dict[int, ProcInfo] = {}
        # What the simulated /proc says of each pid (a process' host_state) and whether it is the host's pid
        # namespace (the state's host_pid_namespace): the stand-in's pids are fictitious, so this is their /proc.
        self._state_of: dict[int, str] = {}
        self.host_namespace = True
        self._since: dict[int, float] = {}
        self._clock: float | None = None  # the state's clock (scenario time), when it has one
        self.reads = 0  # how many times the file was parsed (tests check the change detection)
        self.bad = False  # the current file could not be parsed; the names are the last good ones

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._by_pid, self._state_of = None, {}, {}
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp  # a bad file is not re-parsed every poll: only once it changes
        self.reads += 1
        try:
            by_pid, state_of, host_namespace = self._parse()
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            if not self.bad:
                self._log(f"sim state {self.path} unreadable, keeping the last good process names: "
                          f"{type(e).__name__}: {e}", "WARNING")
            self.bad = True
            return
        if self.bad:
            self._log(f"sim state {self.path} readable again", "INFO")
        self.bad = False
        self._by_pid, self._state_of, self.host_namespace = by_pid, state_of, host_namespace

    def _parse(self) -> tuple[dict[int, ProcInfo], dict[int, str], bool]:
        state = read_state(self.path)
        by_pid: dict[int, ProcInfo] = {}
        state_of: dict[int, str] = {}
        devices = state.get("devices") or ()
        # a MIG device's processes (sim/state_mig.py) are host processes like any other
        for dev in [*devices, *(m for d in devices for m in d.get("mig_devices") or ())]:
            procs = dev.get("processes") or {}
            for kind in ("compute", "graphics"):
                for p in procs.get(kind) or ():
                    pid = int(p["pid"])
                    new = (p.get("name"), p.get("user"), p.get("host_rss"))
                    old = by_pid.get(pid, UNKNOWN)
                    # one process on several GPUs / in both lists: keep what any entry knows
                    by_pid[pid] = (old[0] or new[0], old[1] or new[1], old[2] or new[2])
                    if p.get("host_state") not in (None, LIVE):
                        state_of[pid] = str(p["host_state"])
        clock = state.get("clock")
        self._clock = float(clock) if isinstance(clock, int | float) and not isinstance(clock, bool) else None
        return by_pid, state_of, state.get("host_pid_namespace") is not False

    def resolve(self, pids: Sequence[int]) -> dict[int, ProcInfo]:
        self._refresh()
        by_pid = self._by_pid
        return {pid: by_pid.get(pid, UNKNOWN) for pid in pids}

    def states(self, pids: Sequence[int]) -> dict[int, HostState]:
        """What the simulated /proc says of each pid, as
        :class:`~gpuwatchd.sources.nvml.worker.processes.ProcResolver` does for the real one: "gone" is HIDDEN when
        the simulated daemon is not in the host's pid namespace. Ages are in scenario seconds (the state's clock), the
        daemon's time under a scaled sim clock."""
        self._refresh()
        now = self._clock if self._clock is not None else time.monotonic()
        out: dict[int, HostState] = {}
        wanted = set(pids)
        for pid in pids:
            state = self._state_of.get(pid, LIVE)
            if state == GONE and not self.host_namespace:
                state = HIDDEN
            if state == LIVE:
                self._since.pop(pid, None)
                out[pid] = (LIVE, None)
            else:
                out[pid] = (state, now - self._since.setdefault(pid, now))
        for gone in [p for p in self._since if p not in wanted]:
            del self._since[gone]
        return out


def from_env(env: Mapping[str, str] | None = None, log: Log | None = None) -> SimResolver:
    """The resolver for the state file the stand-in reads (``GPUWATCHD_SIM_STATE``)."""
    env = os.environ if env is None else env
    return SimResolver(Path(env.get(STATE_ENV, "")), log)
