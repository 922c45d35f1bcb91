"""Scenario player: the pure interpreter ``state_at(scenario, t)`` and the ``Player`` that writes it as time runs.

``state_at`` is a pure function of the scenario and the scenario time, so tests and ``bench/detect.py`` can sample
a scenario without any process, and everything stateful (event sequence numbers, process churn, the energy
counter) is derived from ``t``. The :class:`Player` shares one :class:`~gpuwatchd.runtime.clock.Clock` with the daemon,
so with ``--speed X`` scenario time and daemon time are the same number.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.runtime.clock import Clock
from gpuwatchd.sim.kmsg_replay import ReplayRing, due_lines
from gpuwatchd.sim.pci_tree import mirror_sysfs
from gpuwatchd.sim.procutil import PROCESS_UTIL_FIELDS, derive_process_utilization
from gpuwatchd.sim.scenario import (
    FieldPath,
    PlateauSpec,
    PopulationSpec,
    RampSpec,
    Scenario,
    Step,
    WaveSpec,
)
from gpuwatchd.sim.scenario_mig import derive_mig_memory
from gpuwatchd.sim.series_step import SeriesSpec, series_value
from gpuwatchd.sim.tb_tree import hide_untunnelled

# Unix time that scenario t=0 maps to when no clock is given: fixed, so sampled states are reproducible.
SCENARIO_EPOCH = 1_700_000_000.0
# How long a queued event stays in the state file (scenario seconds). The stand-in delivers each seq once per
# event set, so keeping events a while only costs bytes; a minute covers a worker respawn at the default backoff.
EVENT_RETENTION_S = 60.0
# Resolution of the energy integral over changing power (ramps, waves): 1 s matches the default poll interval.
ENERGY_STEP_S = 1.0
# Simulated pids stay below the kernel's default pid_max (PID_MAX_DEFAULT, 0x8000, include/linux/threads.h): the
# daemon drops pids above the host's pid_max as garbage, and many hosts never raise it.
PID_MAX = 32_768
# The player never rewrites the state file more often than this in wall seconds, whatever --speed says: each
# write is an fsync + rename and the stand-in re-reads the file, which at speed 1000 would otherwise eat a core.
MIN_WALL_TICK_S = 0.1

WriteFn = Callable[[Path, dict[str, Any]], None]


def state_at(scenario: Scenario, t: float, *, start: float = SCENARIO_EPOCH) -> dict[str, Any]:
    """The stand-in state (``docs/sim-state.md``) of ``scenario`` at scenario time ``t`` seconds."""
    from gpuwatchd.sim.state import make_device, make_state

    t = max(0.0, float(t))
    cycle, te = _cycle(scenario, t)
    state = make_state(0)
    state.update(copy.deepcopy(scenario.system))
    devices = [_base_device(scenario, make_device(i), i) for i in range(scenario.gpus)]
    order = list(range(scenario.gpus))
    for step in scenario.steps:
        if step.at > te:
            break
        _apply(step, te, state, devices, order)
    if scenario.population is not None:
        for slot in order:
            devices[slot]["processes"]["compute"].extend(_population(scenario.population, scenario.gpus, slot, t))
    for slot, dev in enumerate(devices):
        derive_mig_memory(dev)  # sim/scenario_mig.py: MIG devices' memory, added to their GPU's
        _derive_memory(dev)
        if "energy_mj" in dev and dev["energy_mj"] is not None:
            dev["energy_mj"] = int(dev["energy_mj"] + _energy_mj(scenario, slot, dev, cycle, te))
    state["devices"] = [devices[s] for s in order]
    state["events"] = _events(scenario, t)
    state["clock"] = start + t
    for dev in state["devices"]:
        derive_process_utilization(dev, state["clock"])
    return hide_untunnelled(state)


def _cycle(scenario: Scenario, t: float) -> tuple[int, float]:
    if scenario.loop and scenario.duration > 0:
        n, te = divmod(t, scenario.duration)
        return int(n), te
    return 0, t


def _base_device(scenario: Scenario, default: dict[str, Any], slot: int) -> dict[str, Any]:
    dev = default
    for key in ("all", slot):
        if key in scenario.devices:
            dev = _merge(dev, scenario.devices[key])
    dev.setdefault("processes", {})
    dev["processes"].setdefault("compute", [])
    dev["processes"].setdefault("graphics", [])
    dev.setdefault("lost", False)
    # Scenario memory.used counts memory no listed process owns (driver, other contexts); processes add to it.
    dev["_other_used"] = dev["memory"]["used"] if isinstance(dev.get("memory"), dict) else None
    return dev


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("errors", "delays_ms"):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _slots(fp: FieldPath, n: int) -> range | list[int]:
    return range(n) if fp.slot == "*" else [int(fp.slot)] if fp.slot is not None and int(fp.slot) < n else []


def _apply(step: Step, te: float, state: dict[str, Any], devices: list[dict[str, Any]], order: list[int]) -> None:
    spec = step.spec
    if step.action == "set":
        for fp, value in step.values:
            _assign_path(fp, copy.deepcopy(value), state, devices)
    elif step.path is not None:
        _assign_path(step.path, function_value(spec, te - step.at), state, devices)
    elif step.action == "add_process":
        procs = devices[spec.gpu]["processes"][spec.kind]
        procs[:] = [p for p in procs if p["pid"] != spec.pid]
        entry = {"pid": spec.pid, "used_memory": spec.used_memory, "name": spec.name, "user": spec.user}
        if spec.host_rss is not None:
            entry["host_rss"] = spec.host_rss
        if spec.cgroup is not None:
            entry["cgroup"] = spec.cgroup
        if spec.host_state != "live":
            entry["host_state"] = spec.host_state
        entry.update({f: getattr(spec, f) for f in PROCESS_UTIL_FIELDS if getattr(spec, f) is not None})
        procs.append(entry)
    elif step.action == "remove_process":
        for kind in ("compute", "graphics"):
            lst = devices[spec.gpu]["processes"][kind]
            lst[:] = [p for p in lst if p["pid"] != spec.pid]
    elif step.action == "lose":
        assert step.gpu is not None
        devices[step.gpu]["lost"] = True
    elif step.action == "remove":
        if step.gpu in order:
            order.remove(step.gpu)
    elif step.action == "insert":
        if spec.gpu not in order:
            order.insert(min(spec.index, len(order)), spec.gpu)
        devices[spec.gpu]["lost"] = False  # a replugged board is a fresh device


def function_value(spec: Any, dt: float) -> float:
    """Value of a ramp / plateau / wave ``dt`` seconds after its step starts."""
    if isinstance(spec, RampSpec):
        frac = min(1.0, max(0.0, dt / spec.over))
        return spec.from_ + (spec.to - spec.from_) * frac
    if isinstance(spec, PlateauSpec):
        if dt < spec.warmup:
            # Saturating growth: the caching allocator reserves big blocks early and fewer later on.
            k = PLATEAU_WARMUP_SHAPE
            frac = (1 - math.exp(-k * dt / spec.warmup)) / (1 - math.exp(-k))
            return spec.base + (spec.peak - spec.base) * frac
        in_spike = spec.spike_len > 0 and (dt - spec.warmup) % spec.every >= spec.every - spec.spike_len
        return spec.peak + (spec.spike if in_spike else 0)
    if isinstance(spec, WaveSpec):
        return spec.mean + spec.amplitude * math.sin(2 * math.pi * dt / spec.period)
    if isinstance(spec, SeriesSpec):
        return series_value(spec, dt)
    raise TypeError(f"not a function step: {spec!r}")


# Curvature of the warm-up: 3 puts ~95% of the growth in the warm-up span's first 100% (1 - e^-3), the shape a
# training job's reserved memory shows over its first iterations.
PLATEAU_WARMUP_SHAPE = 3.0


def _assign_path(fp: FieldPath, value: Any, state: dict[str, Any], devices: list[dict[str, Any]]) -> None:
    if fp.slot is None:
        if len(fp.keys) > 1:  # thunderbolt.devices[0].authorized
            _assign(state, fp.keys, value)
        else:
            state[str(fp.keys[0])] = value
        return
    for slot in _slots(fp, len(devices)):
        _assign(devices[slot], fp.keys, value)


def _assign(node: Any, keys: tuple[Any, ...], value: Any) -> None:
    """Set ``value`` at ``keys`` below ``node``; a process or list entry that does not exist (yet) is skipped."""
    if keys[0] == "memory" and len(keys) == 2 and keys[1] == "used":
        node["_other_used"] = value
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(k, tuple):  # ("pid", n)
            match = [p for p in node if p.get("pid") == k[1]]
            if not match:
                return
            if last:
                node[node.index(match[0])] = value
                return
            node = match[0]
        elif isinstance(k, int):
            if not isinstance(node, list) or k >= len(node):
                return
            if last:
                node[k] = _like(node[k], value)
                return
            node = node[k]
        else:
            if last:
                node[k] = _like(node.get(k), value)
                return
            if not isinstance(node.get(k), dict | list):
                node[k] = {}
            node = node[k]


def _like(old: Any, value: Any) -> Any:
    """Keep integer fields integers when a ramp computes a float."""
    if isinstance(value, float) and ((isinstance(old, int) and not isinstance(old, bool)) or old is None):
        return round(value)
    return value


def _derive_memory(dev: dict[str, Any]) -> None:
    other = dev.pop("_other_used", None)
    mem = dev.get("memory")
    if not isinstance(mem, dict) or other is None:
        return
    procs = dev["processes"]["compute"] + dev["processes"]["graphics"]
    used = int(other) + sum(int(p["used_memory"]) for p in procs if p.get("used_memory"))
    ceiling = int(mem.get("total") or 0) - int(mem.get("reserved") or 0)
    mem["used"] = max(0, min(used, ceiling)) if ceiling > 0 else used


def _population(pop: PopulationSpec, n_gpus: int, slot: int, t: float) -> list[dict[str, Any]]:
    """Slot ``j`` of GPU ``slot`` is replaced round-robin, ``churn_count`` slots per tick: pids stay stable
    between ticks and never repeat while they fit below pid_max."""
    ticks = math.floor(t / pop.churn_every)
    replaced = ticks * pop.churn_count
    per_gen = n_gpus * pop.per_gpu
    max_gen = max(1, (PID_MAX - 1 - pop.pid_start) // max(1, per_gen))
    out = []
    for j in range(pop.per_gpu):
        gen = max(0, -(-(replaced - j) // pop.per_gpu)) % max_gen
        h = _mix(slot, j, gen)
        span = max(0, pop.memory_max - pop.memory_min) >> 21  # real allocations come in 2 MiB pages
        out.append({
            "pid": pop.pid_start + (gen * n_gpus + slot) * pop.per_gpu + j,
            "used_memory": pop.memory_min + ((h % (span + 1)) << 21),
            "name": pop.names[h % len(pop.names)],
            "user": pop.users[(h >> 8) % len(pop.users)],
        })
    return out


def _mix(*parts: int) -> int:
    h = 2166136261
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 16777619) & 0xFFFFFFFF
    return h


def _events(scenario: Scenario, t: float) -> list[dict[str, Any]]:
    """Events whose time lies in (t - retention, t]; seq counts every event since t=0, across loop cycles."""
    ev_steps = [s for s in scenario.steps if s.action in ("event", "xid")]
    if not ev_steps:
        return []
    period = scenario.duration if scenario.loop else math.inf
    first = 0 if not scenario.loop else max(0, math.floor((t - EVENT_RETENTION_S) / period))
    last = 0 if not scenario.loop else math.floor(t / period)
    out = []
    for c in range(first, last + 1):
        for k, s in enumerate(ev_steps):
            at = s.at + (c * period if scenario.loop else 0)
            if t - EVENT_RETENTION_S < at <= t or (at == 0 and t == 0):
                out.append(_event(scenario, s, c * len(ev_steps) + k + 1))
    return out


def _event(scenario: Scenario, step: Step, seq: int) -> dict[str, Any]:
    from gpuwatchd.sim.state import make_device

    spec = step.spec
    dev = _base_device(scenario, make_device(spec.gpu), spec.gpu)
    kind, data = ("xid", spec.code) if step.action == "xid" else (spec.type, spec.data)
    return {"seq": seq, "uuid": dev["uuid"], "type": kind, "data": data}


def _is_power(fp: FieldPath | None, slot: int) -> bool:
    return fp is not None and fp.keys == ("power_usage_mw",) and (fp.slot in ("*", slot))


def _function_integral(spec: Any, a: float, b: float) -> float:
    """Integral of ``function_value(spec, x)`` for x in [a, b] (closed form where there is one)."""
    if isinstance(spec, WaveSpec):
        w = 2 * math.pi / spec.period
        return spec.mean * (b - a) - spec.amplitude / w * (math.cos(w * b) - math.cos(w * a))
    if isinstance(spec, RampSpec):
        mid = min(max(spec.over, a), b)  # linear up to `over`, flat after: both exact with the midpoint rule
        return (function_value(spec, (a + mid) / 2) * (mid - a)) + function_value(spec, b) * (b - mid)
    n = max(1, math.ceil((b - a) / ENERGY_STEP_S))
    h = (b - a) / n
    return sum(function_value(spec, a + (i + 0.5) * h) * h for i in range(n))


def _energy_mj(scenario: Scenario, slot: int, dev: dict[str, Any], cycles: int, te: float) -> float:
    """Energy since t=0 (mW x s = mJ) of the power track, integrated piecewise; loops add whole cycles."""
    from gpuwatchd.sim.state import make_device

    base = float(_base_device(scenario, make_device(slot), slot).get("power_usage_mw") or 0.0)
    steps = [s for s in scenario.steps if _is_power(s.path, slot) or any(_is_power(fp, slot) for fp, _ in s.values)]

    def integral(upto: float) -> float:
        # Between two step times the last step that wrote the power field decides it alone.
        cuts = sorted({0.0, upto, *(s.at for s in steps if s.at < upto)})
        total = 0.0
        for a, b in itertools.pairwise(cuts):
            writer = [s for s in steps if s.at <= a]
            if not writer:
                total += base * (b - a)
            elif writer[-1].path is not None:
                w = writer[-1]
                total += _function_integral(w.spec, a - w.at, b - w.at)
            else:
                v = [v for fp, v in writer[-1].values if _is_power(fp, slot)][-1]
                total += float(v or 0) * (b - a)
        return total

    whole = integral(scenario.duration) * cycles if cycles else 0.0
    return whole + integral(te)


class Player:
    """Writes ``state_at(scenario, clock.now() - start)`` to ``state_path`` whenever the state changes.

    With ``sysfs_root`` it also keeps a fake ``sys/bus/pci/devices`` tree in step with the state.
    """

    def __init__(self, scenario: Scenario, state_path: Path, clock: Clock, *, tick: float = 0.5,
                 start: float | None = None, write: WriteFn | None = None, sysfs_root: Path | None = None,
                 kmsg: ReplayRing | None = None) -> None:
        if tick <= 0:
            raise ValueError("tick must be > 0")
        self.scenario = scenario
        self.state_path = Path(state_path)
        self.clock = clock
        self.tick = tick
        self.start = clock.now() if start is None else start
        self.started = False  # set by whoever starts run(): sim/runner.py waits for the daemon's first snapshot
        self.writes = 0
        self._write = write
        self.sysfs_root = sysfs_root
        self._last: dict[str, Any] | None = None
        # The sim's kernel ring: scenario ``kmsg`` steps are appended once their time has come, after the state
        # of that moment is written (the kernel logs what the hardware did).
        self.kmsg = kmsg
        self._kmsg_until = -1.0

    def scenario_time(self) -> float:
        """Seconds of scenario time since the start (the daemon's clock minus the start)."""
        return max(0.0, self.clock.now() - self.start)

    def state(self, t: float) -> dict[str, Any]:
        """The state as written: ``state_at`` with call delays turned into wall milliseconds.

        The stand-in sleeps in real time, while scenario delays are in scenario time: at ``--speed 10`` a
        60 s hang lasts 6 wall seconds, which is 60 s on the daemon's (scaled) clock.
        """
        state = state_at(self.scenario, t, start=self.start)
        speed = self.clock.speed
        if speed != 1.0:
            for dev in state["devices"]:
                delays = dev.get("delays_ms") or {}
                for sym, ms in delays.items():
                    if isinstance(ms, int | float) and ms > 0:
                        delays[sym] = max(1, round(ms / speed))
        return state

    def write_initial(self) -> dict[str, Any]:
        """Write the state at the current scenario time unconditionally (before the daemon starts)."""
        state = self.state(self.scenario_time())
        self._store(state)
        return state

    def step(self) -> bool:
        """Write the current state if it differs from the last one written; True if it wrote."""
        t = self.scenario_time()
        state = self.state(t)
        if self._last is not None and _without_clock(state) == _without_clock(self._last):
            self._emit_kmsg(t)
            return False
        self._store(state)
        self._emit_kmsg(t)
        return True

    def _emit_kmsg(self, t: float) -> None:
        if self.kmsg is not None:
            self.kmsg.append_lines(due_lines(self.scenario, self._kmsg_until, t))
            self._kmsg_until = t

    async def run(self) -> None:
        """Keep the state file current until cancelled."""
        tick = max(self.tick, MIN_WALL_TICK_S * self.clock.speed)
        while True:
            # A thread cannot be cancelled: a cancel that lands mid-step waits for the step to finish, so nothing
            # still writes the state file or the fake sysfs tree once run() has returned (sim/runner.py removes
            # them right after).
            step = asyncio.ensure_future(asyncio.to_thread(self.step))
            try:
                await asyncio.shield(step)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await step
                raise
            await self.clock.sleep(tick)

    def _store(self, state: dict[str, Any]) -> None:
        if self._write is None:
            from gpuwatchd.sim.state import write_state

            self._write = write_state
        # The state file first, then the PCI tree: the daemon re-enumerates when the tree changes, and a worker
        # started on a vanished directory must not find the old device list (the kernel, too, unbinds the driver
        # before the sysfs directory goes). Tree first let the re-enumeration miss a removal altogether.
        self._write(self.state_path, state)
        if self.sysfs_root is not None and (
            self._last is None
            or self._last["devices"] != state["devices"]
            or self._last.get("thunderbolt") != state.get("thunderbolt")
        ):
            mirror_sysfs(self.sysfs_root, state)
        self._last = state
        self.writes += 1


def _without_clock(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "clock"}
