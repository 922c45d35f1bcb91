"""The simulator's process resolver: host facts of the stand-in's fictitious pids, from the sim state file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuwatchd.sim.resolver import SimResolver, from_env
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sources.nvml.worker.processes import UNKNOWN


def test_sim_resolver_reads_the_state_file_the_stand_in_reads(tmp_path: Path) -> None:
    sim = from_env({STATE_ENV: str(tmp_path / "state")})
    assert sim.path == tmp_path / "state"


def _sim_state(path: Path, names: dict[int, str]) -> None:
    from gpuwatchd.sim.state import make_state, write_state

    state = make_state(1)
    state["devices"][0]["processes"] = {
        "compute": [{"pid": pid, "used_memory": 1 << 20, "name": n, "user": "alice", "host_rss": 4096}
                    for pid, n in names.items()],
        "graphics": [],
    }
    write_state(path, state)


def test_sim_resolver_keeps_last_good_names_when_the_state_file_is_garbage(tmp_path: Path) -> None:
    path = tmp_path / "state"
    logged: list[tuple[str, str]] = []
    resolver = SimResolver(path, lambda msg, level: logged.append((level, msg)))
    _sim_state(path, {101: "train", 102: "eval"})
    assert resolver.resolve([101, 102, 999]) == {101: ("train", "alice", 4096), 102: ("eval", "alice", 4096),
                                                 999: UNKNOWN}
    assert logged == []
    for garbage in ("not a state file\n", "\x00\xff" * 50, ""):  # hand-edited, binary, truncated to nothing
        path.write_bytes(garbage.encode("latin-1"))
        os.utime(path, ns=(time.time_ns(), time.time_ns()))  # a new stamp even within the mtime granularity
        assert resolver.resolve([101]) == {101: ("train", "alice", 4096)}
        assert resolver.bad
    assert [lvl for lvl, _ in logged] == ["WARNING"]  # once for the whole run of bad files, not per poll or file
    assert str(path) in logged[0][1] and "ValueError" in logged[0][1]
    reads = resolver.reads
    resolver.resolve([101])
    assert resolver.reads == reads  # an unchanged bad file is not parsed again every poll
    _sim_state(path, {101: "train2"})
    assert resolver.resolve([101, 102]) == {101: ("train2", "alice", 4096), 102: UNKNOWN}
    assert not resolver.bad
    assert [lvl for lvl, _ in logged] == ["WARNING", "INFO"]


def test_sim_resolver_survives_a_well_formed_file_of_the_wrong_shape(tmp_path: Path) -> None:
    from gpuwatchd.sim.state import MAGIC

    path = tmp_path / "state"
    logged: list[str] = []
    resolver = SimResolver(path, lambda msg, level: logged.append(level))
    _sim_state(path, {7: "a"})
    resolver.resolve([7])
    # complete framing, but a process without a pid (read_state checks the framing only): KeyError inside
    bad = json.dumps({"devices": [{"processes": {"compute": [{"name": "no pid"}]}}]})
    path.write_text(f"{MAGIC}\n# json {bad}\nEND\n")
    assert resolver.resolve([7]) == {7: ("a", "alice", 4096)}
    assert logged == ["WARNING"]


def test_sim_resolver_models_proc_for_dead_pids(tmp_path: Path) -> None:
    from gpuwatchd.sim.state import make_state, write_state

    path = tmp_path / "state"
    state = make_state(1)
    state["clock"] = 1000.0
    state["devices"][0]["processes"] = {
        "compute": [{"pid": 1, "used_memory": 1 << 30}, {"pid": 2, "used_memory": 1 << 30, "host_state": "gone"},
                    {"pid": 3, "used_memory": 1 << 30, "host_state": "zombie"}],
        "graphics": [],
    }
    write_state(path, state)
    sim = SimResolver(path)
    assert sim.states([1, 2, 3]) == {1: ("live", None), 2: ("gone", 0.0), 3: ("zombie", 0.0)}
    # ages in the state's clock (scenario seconds)
    state["clock"] = 1030.0
    time.sleep(0.01)
    write_state(path, state)
    assert sim.states([1, 2, 3])[2] == ("gone", 30.0)
    # the daemon in a container without the host's pids: a missing pid is hidden, a zombie is still a zombie
    state["host_pid_namespace"] = False
    time.sleep(0.01)
    write_state(path, state)
    assert sim.states([2, 3]) == {2: ("hidden", 30.0), 3: ("zombie", 30.0)}
    assert sim.host_namespace is False
