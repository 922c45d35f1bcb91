"""The daemon's probe service: availability, the schedule loop, one run at a time, judging, baselines.

Built by the daemon (``gpuwatchd run``: real GPUs, ``--device cuda``) or by ``gpuwatchd sim`` with a
:class:`~gpuwatchd.sim.probes.SimProbes` (the CPU device, attributed to each simulated GPU, faults injected from
the scenario). Never imports torch: whether torch can run is asked of a one-shot worker (``--check``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import sys
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwatchd.config.loader import Config
from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.gpu.pcie_bandwidth import LinkExpectation, expectation, tunnel_name
from gpuwatchd.model import (
    ProbeAvailability,
    ProbeBaselineResets,
    ProbeResultEvent,
    ProbeSkipped,
    StateFileSetAside,
)
from gpuwatchd.model.probes import WORKER, ProbeRecord
from gpuwatchd.probes.baseline import FILE_NAME, Baselines
from gpuwatchd.probes.config import ProbesConfig
from gpuwatchd.probes.faults import ProbeSim
from gpuwatchd.probes.runner import WorkerRun, run_worker, worker_env
from gpuwatchd.probes.scheduler import Scheduler, foreign_process, present
from gpuwatchd.probes.verdict import LINK_MEASURES, degraded_problem, judge_probe, ratio
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sources.sysfs.pcie import PCI_DEVICES, read_attr
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

TICK_S = 5.0  # how often (clock seconds) the schedule is looked at
WATCH_S = 0.25  # how often (wall seconds) a running probe checks for a user's job or a lost GPU
CHECK_DEADLINE_S = 120.0
# CPU sizes (tests, sim): about a second of work on a busy core.
CPU_SIZES = ["--gemm-n", "96", "--memory-bytes", str(1 << 20), "--transfer-bytes", str(1 << 20)]
ENABLE_HINT = {
    "torch_not_installed": "install the probes extra (pip install 'gpuwatchd[probes]') or point probes.python at "
                           "an interpreter that has torch",
    "torch_without_cuda": "this torch is a CPU-only build: install a CUDA build of torch (pip install "
                          "'gpuwatchd[probes]' from the PyTorch CUDA index)",
    "driver_too_old": "the NVIDIA driver is older than torch's CUDA needs: update the driver or install a torch "
                      "built for an older CUDA",
    "no_cuda_device": "torch sees no CUDA device",
    "check_failed": "the torch check itself failed (see the log line above)",
    "disabled": "probes.enabled is false",
}
_CHECKED: dict[tuple[str, str], tuple[bool, str | None]] = {}  # (python, device) -> result, once per process


def behind_thunderbolt(sysfs_root: Path, bus_id: str | None) -> bool:
    """True when sysfs marks the GPU or a bridge above it removable (an external-facing Thunderbolt/USB4 port,
    Linux >= 5.14; the kernel's Documentation/ABI/testing/sysfs-devices-removable)."""
    if not bus_id:
        return False
    try:
        d = (sysfs_root / PCI_DEVICES / sysfs_bus_id(bus_id)).resolve()
    except OSError:
        return False
    # One page, non-blocking, regular files only: a FIFO in a fake tree blocked the loop here, and a byte outside
    # ASCII raised UnicodeDecodeError out of the probe's verdict.
    return any(read_attr(node / "removable") == "removable" for node in (d, *d.parents))


def torch_cuda_build(locations: Iterable[str] | None) -> bool | None:
    """Whether the torch package at ``locations`` is a CUDA build, from its ``version.py`` (``cuda = None`` in a
    CPU-only build; "12.4" in a CUDA one), without importing it; None when that file cannot be read."""
    for loc in locations or ():
        try:
            text = (Path(loc) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
        if m is None:
            return None
        return m.group(1).strip() != "None"
    return None


class ProbeService:
    def __init__(self, config: Config, store: Store, clock: Clock, state_dir: Path | None, *,
                 sim: ProbeSim | None = None, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.store = store
        self.ledger = store.probes  # read only: what changes it enters through store.ingest
        self.clock = clock
        self.sim = sim
        self.device = "cpu" if sim is not None else "cuda"
        self._env = dict(os.environ if env is None else env)
        self.baselines = Baselines(state_dir / FILE_NAME if state_dir else None, config.probes.baseline_runs)
        store.ingest(ProbeBaselineResets(self.baselines.resets))
        if self.baselines.resets:
            store.ingest(StateFileSetAside("probe_baselines", self.baselines.resets))
        self.scheduler = Scheduler(config.probes)
        self._gpu_locks: dict[str, asyncio.Lock] = {}  # one run per GPU at a time
        # uuid -> wall (monotonic) start of its run. A run holds one of the host's ``probes.parallel`` slots until
        # it ends or has run ``probes.hang_after`` (then it is suspected hung and waits for its deadline without
        # holding the host: one hung GPU does not stop the others' probes).
        self._running: dict[str, float] = {}
        self._hung_logged: set[str] = set()
        self.own_pids: set[int] = set()
        # Workers of past runs: their compute process stays in the activity log for idle_for after the run, and
        # must not make their own GPU look busy (bounded; a pid reused by a user's job that soon is unlikely).
        self.past_pids: deque[int] = deque(maxlen=256)
        self._tasks: set[asyncio.Future[None]] = set()
        self._logged_unavailable = False

    @property
    def cfg(self) -> ProbesConfig:
        return self.config.probes

    def reconfigure(self, config: Config) -> None:
        self.config = config
        self.scheduler.cfg = config.probes

    # -- availability --------------------------------------------------------------------------------------------

    @property
    def python(self) -> str:
        return str(self.cfg.python) if self.cfg.python is not None else sys.executable

    async def ensure_available(self) -> bool:
        if not self.cfg.enabled:
            self._set_available(False, "disabled")
            return False
        if self.ledger.available is not None and self.ledger.unavailable_reason != "disabled":
            return self.ledger.available
        key = (self.python, self.device)
        if key not in _CHECKED:
            _CHECKED[key] = await self._check()
        ok, reason = _CHECKED[key]
        self._set_available(ok, reason)
        return ok

    async def _check(self) -> tuple[bool, str | None]:
        if self.cfg.python is None:
            spec = importlib.util.find_spec("torch")
            if spec is None:
                return False, "torch_not_installed"
            if self.device == "cuda" and torch_cuda_build(spec.submodule_search_locations) is False:
                return False, "torch_without_cuda"  # read from torch/version.py: no torch import, no subprocess
        if self.device == "cpu":
            return True, None  # sim: torch imports (find_spec) and the CPU device always exists
        argv = [self.python, "-m", "gpuwatchd.probes.worker", "--check", "--device", "cuda"]
        try:
            run = await run_worker(argv, worker_env(self._env, None), CHECK_DEADLINE_S)
        except OSError as e:
            log.warning("probes: cannot start %s for the torch check: %s", self.python, e.strerror or e)
            return False, "torch_not_installed" if self.cfg.python is not None else "check_failed"
        if run.outcome != "ok" or run.result is None or not isinstance(run.result.get("check"), dict):
            if self.cfg.python is not None and "No module named 'torch'" in run.detail:
                return False, "torch_not_installed"
            log.warning("probes: the torch availability check failed: %s", run.detail or run.outcome)
            return False, "check_failed"
        chk = run.result["check"]
        if chk.get("available"):
            log.info("probes: torch %s with CUDA %s is available", chk.get("torch"), chk.get("cuda"))
            return True, None
        if chk.get("detail"):
            log.info("probes: torch says: %s", chk["detail"])
        return False, str(chk.get("reason") or "no_cuda_device")

    def _set_available(self, ok: bool, reason: str | None) -> None:
        if not self.store.ingest(ProbeAvailability(ok, reason)):
            return  # no change
        if not ok and not self._logged_unavailable and reason != "disabled":  # the user's choice: nothing to say
            self._logged_unavailable = True
            log.warning("torch health probes are off (%s): %s", reason, ENABLE_HINT.get(reason or "", reason))

    # -- schedule ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """The daemon task: say at once whether probes can run (``gpuwatchd_probe_available`` from the start, with
        or without GPUs or a driver), then look at the schedule every TICK_S clock seconds and start what is due,
        each run in its own task, up to ``probes.parallel`` runs that are not suspected hung."""
        try:
            await self.ensure_available()
        except Exception:
            log.exception("the probe availability check failed; it is tried again when a probe is due")
        try:
            while True:
                try:
                    while (uuid := await self._next()) is not None:
                        task = asyncio.ensure_future(self._run_reserved(uuid))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                except Exception:
                    # A probe problem must never take the daemon down (the task ending would stop it): log, go on.
                    log.exception("probe scheduling step failed; probes continue at the next tick")
                await self.clock.sleep(TICK_S)
        finally:
            # The daemon stops: every run's worker group is killed and reaped by its own task's cancellation.
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_reserved(self, uuid: str) -> None:
        try:
            await self.run_gpu(uuid, reserved=True)
        except Exception:
            log.exception("probe run on %s failed; probes continue", uuid)

    async def step(self) -> list[ProbeRecord]:
        """Run the most overdue idle GPU's probes, if any is due and a slot is free (tests call this directly)."""
        uuid = await self._next()
        return [] if uuid is None else await self.run_gpu(uuid, reserved=True)

    def _slots_used(self) -> int:
        """Runs holding a host slot: those not yet running for ``probes.hang_after``."""
        t = time.monotonic()
        return sum(1 for start in self._running.values() if t - start < self.cfg.hang_after)

    @property
    def running(self) -> list[str]:
        return sorted(self._running)

    async def _next(self) -> str | None:
        """The GPU to probe now (reserved: counted as running from here), or None."""
        if not self.cfg.enabled:
            self._set_available(False, "disabled")
            return None
        if self._slots_used() >= self.cfg.parallel:
            return None
        now = self.clock.now()
        due, skips = self.scheduler.decide(self.store, now, self.own_pids | set(self.past_pids))
        for uuid, reason in skips:
            self.store.ingest(ProbeSkipped(uuid, reason, now))
        due = [u for u in due if not self._busy(u)]
        if not due:
            return None
        if not await self.ensure_available():
            for uuid in due:
                self.store.ingest(ProbeSkipped(uuid, "unavailable", now))
                self.scheduler.started(uuid, now)  # look again at the next interval, not every tick
            return None
        due = [u for u in due if not self._busy(u)]  # the check may have awaited
        if not due or self._slots_used() >= self.cfg.parallel:
            return None
        self._running[due[0]] = time.monotonic()
        return due[0]

    def _busy(self, uuid: str) -> bool:
        """A run of the GPU is reserved, running, or waiting (an API-requested run holds its lock)."""
        lock = self._gpu_locks.get(uuid)
        return uuid in self._running or (lock is not None and lock.locked())

    async def _wait_slot(self, uuid: str) -> None:
        while self._slots_used() >= self.cfg.parallel:
            await asyncio.sleep(WATCH_S)
        self._running[uuid] = time.monotonic()

    # -- one run -------------------------------------------------------------------------------------------------

    async def run_gpu(self, uuid: str, probes: list[str] | None = None, *, reserved: bool = False) -> list[ProbeRecord]:
        """Probe one GPU now (waits for the GPU's previous run and a host slot); returns the records of the run.
        ``reserved``: the scheduler already counted it as running (``_next``)."""
        lock = self._gpu_locks.setdefault(uuid, asyncio.Lock())
        try:
            async with lock:
                if not reserved:
                    await self._wait_slot(uuid)
                reserved = True
                if not present(self.store, uuid):
                    self.store.ingest(ProbeSkipped(uuid, "gpu_not_present", self.clock.now()))
                    return []
                pid = foreign_process(self.store, uuid, self.own_pids)
                if pid is not None:
                    self.store.ingest(ProbeSkipped(uuid, "busy_process", self.clock.now()))
                    self.scheduler.postpone(uuid, self.clock.now())
                    return []
                return await self._run_locked(uuid, probes or self.cfg.selected())
        finally:
            if reserved:
                self._running.pop(uuid, None)
                self._hung_logged.discard(uuid)

    def _argv(self, probes: list[str], faults_json: str | None) -> list[str]:
        cfg = self.cfg
        argv = [self.python, "-m", "gpuwatchd.probes.worker", "--device", self.device]
        for p in probes:
            argv += ["--probe", p]
        if self.device == "cpu":
            argv += CPU_SIZES
        else:
            argv += ["--gemm-n", str(cfg.gemm_n), "--memory-bytes", str(cfg.memory_bytes),
                     "--memory-share", str(cfg.max_memory_share), "--transfer-bytes", str(cfg.transfer_bytes)]
        if faults_json is not None:
            argv += ["--inject", faults_json]
        return argv

    async def _run_locked(self, uuid: str, probes: list[str]) -> list[ProbeRecord]:
        faults = self.sim.faults(uuid) if self.sim is not None else None
        argv = self._argv(probes, faults.to_json() if faults is not None and faults.active else None)
        start = self.clock.now()
        self.scheduler.started(uuid, start)
        cancel = asyncio.Event()
        why: list[str] = []
        worker: list[int] = []

        def started(pid: int) -> None:
            worker.append(pid)
            self.own_pids.add(pid)

        watch = asyncio.ensure_future(self._watch(uuid, worker, cancel, why))
        try:
            run = await run_worker(argv, worker_env(self._env, uuid), self.cfg.deadline, cancel, started)
        except OSError as e:
            run = WorkerRun("crash", None, f"could not be started: {e.strerror or e}", 0.0, None, 0)
        finally:
            watch.cancel()
            self.own_pids.difference_update(worker)
            self.past_pids.extend(worker)
        end = self.clock.now()
        self.scheduler.finished(uuid, end)
        link = self._link(uuid)
        if run.result is not None and self.sim is not None and faults is not None:
            self.sim.adjust(uuid, run.result, faults, link)
        building = self.baselines.building(uuid)  # before this run's values join the baseline
        records = self._judge(uuid, probes, run, end, link=link, cancel_reason=why[0] if why else "job")
        self.store.ingest(ProbeResultEvent(tuple(records), building))
        for r in records:
            if not r.success:
                log.warning("probe %s on %s: %s: %s", r.probe, uuid, r.result, r.problem)
        return records

    async def _watch(self, uuid: str, worker: list[int], cancel: asyncio.Event, why: list[str]) -> None:
        """Kill the probe when a user's job starts on the GPU (the user wins) or the GPU goes away."""
        t0 = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_S)
            if time.monotonic() - t0 >= self.cfg.hang_after and uuid not in self._hung_logged:
                self._hung_logged.add(uuid)
                log.warning("probe run on %s has taken %.0f s (probes.hang_after): suspected hung; the other GPUs' "
                            "probes go ahead, and it is killed at its %.0f s deadline", uuid, self.cfg.hang_after,
                            self.cfg.deadline)
            if not present(self.store, uuid):
                why.append("gpu_lost")
            elif foreign_process(self.store, uuid, set(worker) | self.own_pids) is not None:
                why.append("job")
            if why:
                cancel.set()
                return

    def last_skip(self, uuid: str) -> str | None:
        v = self.ledger.verdicts.get(uuid)
        return v.verdict if v is not None and v.verdict.startswith("skipped") else "skipped"

    def link_expectation(self, uuid: str) -> LinkExpectation | None:
        return self._link(uuid)

    def _link(self, uuid: str) -> LinkExpectation | None:
        g = self.store.gpu(uuid)
        if g is None:
            return None
        gen = g.pcie_link_max_generation or g.pcie_link_generation
        width = g.pcie_link_max_width or g.pcie_link_width
        # Behind a dock the Thunderbolt source found (store.gpu_docks), else sysfs' "removable" mark.
        dock = self.store.gpu_docks.get(uuid)
        if dock is not None and dock in self.store.docks:
            return expectation(gen, width, thunderbolt=True, tunnel=tunnel_name(dock.generation))
        return expectation(gen, width, thunderbolt=behind_thunderbolt(self.config.sysfs.root, g.pci_bus_id))

    def _judge(self, uuid: str, probes: list[str], run: WorkerRun, now: float, *, link: LinkExpectation | None,
               cancel_reason: str) -> list[ProbeRecord]:
        secs = run.seconds
        if run.outcome == "cancelled":
            self.store.ingest(ProbeSkipped(uuid, "gpu_lost" if cancel_reason == "gpu_lost" else "preempted", now))
            return [ProbeRecord(uuid, p, "cancelled", now, secs) for p in probes]
        if run.outcome in ("timeout", "crash") or run.result is None:
            what = f"the probe worker (running {', '.join(probes)}) {run.detail}"
            return [ProbeRecord(uuid, WORKER, "timeout" if run.outcome == "timeout" else "crash", now, secs,
                                problem=what)]
        threshold = self.config.rules.probe.degraded_ratio
        out: list[ProbeRecord] = []
        entries: dict[str, Any] = run.result.get("probes") or {}
        for probe in probes:
            entry = entries.get(probe)
            if entry is None:
                continue  # not reached: an earlier probe's CUDA error ended the run (that one is the failure)
            j = judge_probe(probe, entry)
            seconds = float(entry.get("seconds") or 0.0)
            if j.result == "oom":
                self.store.ingest(ProbeSkipped(uuid, "oom", now))
                out.append(ProbeRecord(uuid, probe, "oom", now, seconds, problem=j.problem))
                continue
            ratios: dict[str, float] = {}
            degraded: dict[str, str] = {}
            healthy: dict[str, float] = {}
            for key, value in j.measures.items():
                base = self.baselines.baseline(uuid, key)
                if base is not None:
                    ratios[key] = ratio(key, value, base)
                why = degraded_problem(key, value, base, link if key in LINK_MEASURES else None, threshold)
                if why is not None:
                    degraded[key] = why
                else:
                    healthy[key] = value
            result = j.result
            if result == "pass" and degraded:
                result = "degraded"
            if result == "pass":
                self.baselines.add(uuid, healthy)  # only healthy runs build a baseline
            out.append(ProbeRecord(uuid, probe, result, now, seconds, j.errors, j.problem, dict(j.measures),
                                   ratios, degraded))
        return out

    # -- views ---------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``/api/v1/status`` ``probes`` block: availability and the last verdict per GPU."""
        led = self.ledger
        return {
            "available": led.available,
            "unavailable_reason": led.unavailable_reason,
            "device": self.device,
            "running": self.running[0] if self.running else None,
            "running_gpus": self.running,
            "gpus": {u: {"verdict": v.verdict, "timestamp": v.timestamp, "detail": v.detail}
                     for u, v in sorted(led.verdicts.items())},
        }
