"""A stand-in scenario replayed deterministically through the daemon's own parts, to real local chat sinks.

    state_at(scenario, t) -> stand-in state file -> the real NVML worker (``Worker``, real pynvml, in a child
    process, polled on command) -> the supervisor's snapshot intake -> Store -> RulesEngine -> Dispatcher
    -> real HTTP to one local sink per service
    scenario ``kmsg`` steps -> the kernel-log source's ingest (what the daemon's reader hands it) -> Store

The kernel-log lines due by a step are applied before that step's poll: the kernel logs what happened at once, NVML
reports it at the next poll (docs/kernel-log.md).

Time is a ManualClock stepped by ``step`` scenario seconds, so every run gives the same messages (the exact-text
tests compare them with golden files). What the supervisor does between polls is done here the same way: a fresh
worker after one asked to re-enumerate (GPU lost, count changed) and when the set of NVIDIA PCI functions in sysfs
changes (``pci_tree.sysfs_files`` is the tree ``gpuwatchd sim`` mirrors for the supervisor's hot-plug watch).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuwatchd.config.types import replace
from gpuwatchd.model import Alert
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.probes.config import sim_probes
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.sim.kmsg_replay import due_lines
from gpuwatchd.sim.kmsg_text import parse_text
from gpuwatchd.sim.pci_tree import mirror_sysfs, sysfs_files
from gpuwatchd.sim.player import SCENARIO_EPOCH, state_at
from gpuwatchd.sim.probes import SimProbes
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.state import RELOAD_CHECK_S, write_state
from gpuwatchd.sources.attribution.task import AttributionTask
from gpuwatchd.sources.kmsg.ingest import KernelLogIngest
from gpuwatchd.sources.kmsg.parse import KmsgRecord
from gpuwatchd.sources.kmsg.task import sysfs_topology
from gpuwatchd.sources.nvml.intake import SnapshotIntake
from gpuwatchd.sources.sysfs.thunderbolt import read_docks
from gpuwatchd.store import Store

from .conftest import Sink, start_sink
from .scenario_harness import SCENARIO_RULES, SERVICES, sim_config

CHILD = Path(__file__).with_name("nvml_child.py")
# How long a deliverable notification may take to reach its sink once due: a liveness bound, not a timing check.
DRAIN_TIMEOUT_S = 20.0


class NvmlChild:
    """One long-lived child process running the real NVML worker class against the stand-in."""

    def __init__(self, libdir: Path) -> None:
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), PYTHONPATH=pkg_parent)
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"NVML child ended on {cmd}: exit {self.proc.wait()}\n{err}")
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Replay:
    sinks: dict[str, Sink]
    workers: int  # NVML sessions started (1 + re-enumerations)
    store: Store | None = None  # what the daemon's store held at the end (exported series, status)


# Called after each step's evaluation with the scenario time and the engine's alerts (a test's hand in the run).
StepHook = Callable[[float, list[Alert]], Awaitable[None]]


async def replay(name: str, child: NvmlChild, tmp: Path, *, step: float, tail: float, probes: bool = False,
                 rules: dict[str, Any] | None = None, attribution: AttributionTask | None = None,
                 attribution_loop: bool = False, alertmanager: bool = False,
                 on_step: StepHook | None = None) -> Replay:
    """Run scenario ``name`` from 0 to its end plus ``tail``, one poll and one evaluation every ``step`` seconds.

    With ``probes``, the torch health probes run as under ``gpuwatchd sim`` (CPU device, the sim's schedule and
    fault source), one scheduling step after each poll; a run takes real seconds while the clock stands still.
    ``rules``: the rules config (None: the scenario's own, ``SCENARIO_RULES``; {}: the defaults).
    ``attribution``: the attribution source, refreshed once before the first poll and consulted after every
    snapshot as the daemon does (its proc_root should be ``tmp / "sysfs" / "proc"``, the sim's fake /proc).
    ``attribution_loop``: refresh it in the background as the daemon does (``AttributionTask.run``, every
    ``kubernetes.interval`` wall seconds) instead of once before the first poll: a slow kubelet answers whenever it
    does, between steps. ``alertmanager``: one more sink, ``sinks["alertmanager"]``, as an ``alertmanager`` receiver.
    ``on_step``: awaited after every step's evaluation (:data:`StepHook`). ``name`` may be a scenario file's path.
    """
    scen = load_scenario(name)
    clock = ManualClock(SCENARIO_EPOCH)
    runners: list[web.AppRunner] = []
    sinks: dict[str, Sink] = {}
    for s in (*SERVICES, "alertmanager") if alertmanager else SERVICES:
        sink, runner = await start_sink(f"/{s}/SECRET{s}")
        sinks[s] = sink
        runners.append(runner)
    config = sim_config(sinks, tmp / "state-dir", tmp, rules=SCENARIO_RULES.get(name) if rules is None else rules)
    store = Store(retention_seconds=config.history.retention, step_seconds=config.history.step)
    engine = RulesEngine(config.rules, host=config.host)
    # The supervisor's snapshot intake (stamping, naming GPUs lost at enumeration); no worker is spawned here.
    intake = SnapshotIntake(clock)
    dispatcher = Dispatcher(config.notify, state_dir=tmp / "state-dir", clock=clock, host=config.host)
    kernel_log = KernelLogIngest(store, topology=sysfs_topology(tmp / "sysfs"),
                                 dedup_window=config.kernel_log.dedup_window)
    await dispatcher.start()
    state_path = tmp / "state"
    prober = None
    if probes:
        config = replace(config, probes=sim_probes(config.probes, set()))
        prober = ProbeService(config, store, clock, tmp / "state-dir", sim=SimProbes(state_path))
    workers = 0
    loop_task: asyncio.Task[None] | None = None
    try:
        if attribution is not None and attribution_loop:
            loop_task = asyncio.create_task(attribution.run())
        elif attribution is not None:
            await attribution.refresh()
        fresh = True
        pci: set[str] = set()
        i = 0
        seq, kmsg_until = 0, -1.0
        while (t := i * step) <= scen.duration + tail:
            i += 1
            state = state_at(scen, t)
            write_state(state_path, state)
            # The fake sysfs tree ``gpuwatchd sim`` keeps, read by the real Thunderbolt source (the daemon's dock
            # watch runs on the poll period too).
            mirror_sysfs(tmp / "sysfs", state)
            store.set_docks(read_docks(tmp / "sysfs"))
            devices = set(sysfs_files(state))
            if devices != pci:  # the supervisor's sysfs hot-plug watch
                fresh, pci = True, devices
            if fresh:
                child.call(op="start", state=str(state_path), top_n=config.processes.top_n)
                workers += 1
                fresh = False
            # Lets deliveries run, and the stand-in see the rewritten file. The clock moves only after this, and
            # everything from the poll to the dispatcher runs without yielding: no flush sees a half-done step.
            await asyncio.sleep(2 * RELOAD_CHECK_S)
            clock.t = SCENARIO_EPOCH + t
            for entry in parse_text("\n".join(due_lines(scen, kmsg_until, t)).encode()):
                seq += 1
                kernel_log.apply(KmsgRecord(seq, entry.usec or 0, entry.level, 0, entry.message), clock.now())
            kmsg_until = t
            msg = child.call(op="poll")
            fresh = msg.pop("reenumerate") is not None  # the worker exits; the supervisor starts a fresh one
            # the supervisor's own intake, not a copy of it; then what the daemon does with a snapshot
            snap = kernel_log.filter_snapshot(intake.receive(msg))
            store.apply(snap)
            if attribution is not None:
                store.set_attribution(attribution.resolve(snap))
            kernel_log.after_snapshot(snap)
            if prober is not None:
                await prober.step()
            alerts = list(engine.evaluate(store, clock.now()))
            dispatcher.update(alerts)
            if on_step is not None:
                await on_step(t, alerts)
        await _drain(dispatcher)
    finally:
        if loop_task is not None:
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
        child.call(op="close")
        await dispatcher.stop()
        for r in runners:
            await r.cleanup()
    return Replay(sinks, workers, store)


async def _drain(dispatcher: Dispatcher) -> None:
    """Wait until every queued notification reached its sink."""

    async def empty() -> None:
        while any(dispatcher.outbox.depths().values()):
            dispatcher.wake()
            await asyncio.sleep(0.01)

    await asyncio.wait_for(empty(), DRAIN_TIMEOUT_S)
