"""GpuMemoryHeldByDeadProcess (rules/dead_process.py): memory held by pids with no process, or by no process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert, GpuSample, ProcessSample, Snapshot
from gpuwatchd.rules import dead_process
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import GIB, MIB, T0, gpu, proc, run, snap, with_processes

NAME = "GpuMemoryHeldByDeadProcess"


def alerts(hist: list[tuple[float, list[Alert]]], state: str = "firing") -> list[tuple[float, Alert]]:
    return [(t, a) for t, al in hist for a in al if a.name == NAME and a.state == state]


def dead(pid: int, used: float, state: str, seconds: float, name: str = "python") -> ProcessSample:
    return replace(proc(pid, used, name=name), host_state=state, host_state_seconds=seconds)


def play(make: Callable[[float], Snapshot], end: float, config: RulesConfig | None = None,
         every: float = 10.0) -> list[tuple[float, list[Alert]]]:
    engine = RulesEngine(config or RulesConfig(), host="node1")
    return run(Store(retention_seconds=3600.0, step_seconds=5.0), engine, make, start=T0, end=T0 + end, every=every)


def killed_at(at: float, state: str = "gone", host_ns: bool = True) -> Callable[[float], Snapshot]:
    """GPU 0: pid 4242 holds 18 GiB; at ``at`` s its process dies (``state``) but the memory stays listed."""
    def make(t: float) -> Snapshot:
        s = t - T0
        p = dead(4242, 18 * GIB, state, s - at) if s >= at else replace(proc(4242, 18 * GIB), host_state="live")
        return snap(t, with_processes(gpu(), [p]), host_pid_namespace=host_ns)
    return make


def test_gone_pid_fires_after_the_hold_with_pid_amount_since_and_action() -> None:
    hist = play(killed_at(60), 600)
    fired = alerts(hist)
    assert fired
    t, a = fired[0]
    # the default hold is 2 min from the death (evaluations every 10 s)
    assert 60 + 120 <= t - T0 <= 60 + 120 + 20
    assert a.severity == "warning"
    assert {k: a.labels[k] for k in ("uuid", "gpu", "pid")} == {"uuid": gpu().uuid, "gpu": "0", "pid": "4242"}
    assert "18.0 GiB held by pid 4242 (python), which no longer exists since 2023-11-14 22:14 UTC" in a.summary
    assert "fuser -v /dev/nvidia*" in a.summary and "reset" in a.summary
    assert "nvidia-smi --gpu-reset -i 0" in a.annotations["action"]
    assert a.annotations["held_bytes"] == str(18 * GIB)
    assert float(a.annotations["dead_since"]) == T0 + 60


def test_zombie_fires_and_says_so() -> None:
    fired = alerts(play(killed_at(0, "zombie"), 300))
    assert fired and "a zombie (exited, not reaped by its parent)" in fired[0][1].summary


def test_a_process_in_a_pid_namespace_we_cannot_see_is_not_dead() -> None:
    # "hidden": no /proc entry here, but the daemon is not in the host's pid namespace: nothing, ever.
    assert alerts(play(killed_at(0, "hidden", host_ns=False), 1800), "pending") == []
    assert alerts(play(killed_at(0, "hidden", host_ns=False), 1800)) == []


def test_live_processes_and_unknown_state_never_fire() -> None:
    def make(t: float) -> Snapshot:
        procs = [replace(proc(1, 10 * GIB), host_state="live"), proc(2, 5 * GIB)]  # proc 2: never looked up
        return snap(t, with_processes(gpu(), procs), host_pid_namespace=True)
    assert alerts(play(make, 900), "pending") == []


def test_exiting_process_that_frees_its_memory_in_time_does_not_fire() -> None:
    # /proc loses the pid first; the driver lists it for a few more polls, then drops it: a normal exit.
    def make(t: float) -> Snapshot:
        s = t - T0
        procs = [] if s >= 90 else [dead(4242, 18 * GIB, "gone", s - 60)] if s >= 60 else [proc(4242, 18 * GIB)]
        return snap(t, with_processes(gpu(), procs), host_pid_namespace=True)
    hist = play(make, 600)
    assert alerts(hist) == []
    assert alerts(hist, "pending")  # it was seen, and dropped when the memory was released


def test_small_dead_pid_below_min_memory_is_ignored() -> None:
    def make(t: float) -> Snapshot:
        return snap(t, with_processes(gpu(), [dead(7, 16 * MIB, "gone", t - T0)]), host_pid_namespace=True)
    assert alerts(play(make, 600), "pending") == []
    cfg = validate(RulesConfig, {"dead_process": {"min_memory_bytes": 0, "for": "1m"}})
    fired = alerts(play(make, 300, cfg))
    assert fired and fired[0][0] - T0 <= 80


def test_resolves_when_the_gpu_is_reset_and_says_how() -> None:
    def make(t: float) -> Snapshot:
        s = t - T0
        procs = [] if s >= 400 else [dead(4242, 18 * GIB, "gone", s)]
        return snap(t, with_processes(gpu(), procs), host_pid_namespace=True)
    hist = play(make, 600)
    assert alerts(hist)
    resolved = alerts(hist, "resolved")
    assert resolved and 400 <= resolved[0][0] - T0 <= 420
    assert "pid 4242: the driver released its memory" in resolved[0][1].summary


def _orphaned(used: float, *, host_ns: bool | None = True, total: int | None = 0,
              **kw: object) -> Callable[[float], Snapshot]:
    def make(t: float) -> Snapshot:
        g: GpuSample = replace(gpu(), memory_used_bytes=int(used) if t - T0 >= 60 else 5 * MIB, processes=(),
                               processes_total=total, **kw)  # type: ignore[arg-type]
        return snap(t, g, host_pid_namespace=host_ns)
    return make


def test_memory_with_no_process_fires_after_its_own_hold_without_pid() -> None:
    hist = play(_orphaned(9 * GIB), 1200, every=30.0)
    fired = alerts(hist)
    assert fired
    t, a = fired[0]
    assert 60 + 600 <= t - T0 <= 60 + 600 + 40
    assert "pid" not in a.labels and a.labels["gpu"] == "0"
    assert "9.0 GiB used with no process listed since 2023-11-14 22:14 UTC" in a.summary


def test_no_process_needs_the_host_namespace_a_full_list_and_enough_memory() -> None:
    for make in (_orphaned(9 * GIB, host_ns=False),  # a container: the driver lists only our namespace
                 _orphaned(9 * GIB, host_ns=None),  # unknown
                 _orphaned(9 * GIB, total=None),  # the process list could not be read
                 _orphaned(9 * GIB, mig_mode_current=True),  # a MIG GPU: processes are on its MIG devices
                 _orphaned(700 * MIB)):  # an idle GPU's own allocations
        assert alerts(play(make, 1200, every=60.0), "pending") == []
    cfg = validate(RulesConfig, {"dead_process": {"unattributed_min_bytes": 512 * MIB,
                                                        "unattributed_for": "2m"}})
    fired = alerts(play(_orphaned(700 * MIB), 400, cfg, every=30.0))
    assert fired and fired[0][0] - T0 <= 60 + 120 + 40


def test_disabled() -> None:
    cfg = validate(RulesConfig, {"dead_process": {"enabled": False}})
    assert alerts(play(killed_at(0), 600, cfg), "pending") == []


def test_dead_since_is_counted_from_when_the_age_was_read_not_from_the_evaluation() -> None:
    # The daemon's decoder stamps the age with the snapshot's time (host_state_at) and keeps the object while the
    # death time holds: an evaluation later than the snapshot (a timer run, a late worker) names the same time.
    def make(t: float) -> Snapshot:
        s = t - T0
        p = replace(dead(4242, 18 * GIB, "gone", 30.0), host_state_at=T0 + 90.0)  # read at T0+90: dead since +60
        return snap(t, with_processes(gpu(), [p if s >= 60 else replace(proc(4242, 18 * GIB), host_state="live")]),
                    host_pid_namespace=True)
    fired = alerts(play(make, 600))
    assert fired and all(float(a.annotations["dead_since"]) == T0 + 60 for _, a in fired)


def test_a_condition_handed_back_from_the_last_run_is_the_one_that_would_be_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # rules/dead_process.py gives a process whose sample object, GPU and words are unchanged its last condition
    # object back: at every run, each condition equals the one a run that keeps nothing makes, through processes
    # kept and replaced, an age read without a time (host_state_at None: "now" stands for it) or no age, memory
    # under and over min_memory_bytes, the GPU's memory and index moving, a zombie, and a config change.
    kept = {4242: replace(dead(4242, 18 * GIB, "gone", 40.0), host_state_at=T0),
            4243: dead(4243, 2 * GIB, "zombie", 5.0)}
    small = replace(dead(4244, 16 * MIB, "gone", 7.0), host_state_at=T0)
    ageless = replace(dead(4245, 32 * MIB, "gone", 0.0), host_state_seconds=None)  # no age read
    renamed = replace(kept[4242], used_memory_bytes=17 * GIB, name="torchrun")  # the same memory, other words

    def make(s: float) -> Snapshot:
        procs = [kept[4242] if s < 400 else replace(kept[4242], used_memory_bytes=17 * GIB) if s < 450 else renamed,
                 kept[4243], small if s < 650 else replace(small, used_memory_bytes=1 * GIB), ageless]
        if s >= 200:  # a new object for the same process each poll (a decoder that keeps nothing)
            procs[1] = replace(kept[4243])
        g = with_processes(gpu(index=0 if s < 510 else 1), procs, overhead=int(300 * MIB + (s >= 250) * GIB))
        return snap(T0 + s, g, host_pid_namespace=True)

    store = Store()
    reused = 0
    for s in range(0, 700, 10):
        store.apply(make(s))
        config = validate(RulesConfig, {"dead_process": {"min_memory_bytes": (8 if s >= 600 else 64) * MIB}})
        before = dict(dead_process._LAST.made)
        got = dead_process.conditions(store, T0 + s, config)
        monkeypatch.setattr(dead_process, "_LAST", dead_process._Last())
        fresh = dead_process.conditions(store, T0 + s, config)
        monkeypatch.undo()
        assert got == fresh, s
        reused += sum(any(c is m[6] for m in before.values()) for c in got)
    assert reused >= 30
