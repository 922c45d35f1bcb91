"""Unchanged processes cross the pipe as bare pids (protocol.SameAsLast), dead ones whose age moved as [pid, age], and
the daemon's decoder (model.SnapshotDecoder) restores them: every line decodes to what the full line decodes to."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd import model
from gpuwatchd.model import ProcessSample, Snapshot, SnapshotDecoder, UnknownSnapshotKey, snapshot_from_dict
from gpuwatchd.sim.state import make_state
from gpuwatchd.sources.nvml import protocol
from gpuwatchd.sources.nvml.protocol import SAME_AS_LAST, SameAsLast, encode_line
from tests.sources.workerutil import LiveWorker


def _proc(pid: int, used: int, kind: str = "compute", **extra: Any) -> dict[str, Any]:
    return {"pid": pid, "kind": kind, "used_memory_bytes": used, "name": f"p{pid}", "user": "u",
            "host_rss_bytes": 1 << 30, "host_state": "live", **extra}


def _line(t: float, gpus: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"timestamp": t, "nvml_ok": True,
            "gpus": [{"uuid": u, "index": i, "processes": procs, "processes_total": len(procs)}
                     for i, (u, procs) in enumerate(gpus.items())]}


# A sequence exercising every case: unchanged, changed, new, gone, a C+G pid listed twice, a GPU without processes,
# a GPU missing from a line and back (its processes are sent in full again), reordered lists.
POLLS = [
    {"A": [_proc(1, 10), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 10), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(2, 20), _proc(1, 11)], "B": [_proc(3, 30), _proc(4, 40)]},
    {"A": [_proc(2, 20), _proc(1, 11), _proc(1, 5, "graphics")], "B": []},
    {"A": [_proc(2, 20), _proc(1, 11), _proc(1, 5, "graphics")], "B": [_proc(3, 30)]},
    {"A": [_proc(2, 20), _proc(1, 11)]},
    {"A": [_proc(2, 20), _proc(1, 11)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 11, utilization_percent=[5, 6, 0, 0]), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 11, utilization_percent=[5, 6, 0, 0]), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 11, host_state="gone", host_state_seconds=0.0), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 11, host_state="gone", host_state_seconds=1.5), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 11, host_state="gone", host_state_seconds=2.5), _proc(2, 20)], "B": [_proc(3, 30)]},
    {"A": [_proc(1, 12, host_state="gone", host_state_seconds=3.5), _proc(2, 20)], "B": [_proc(3, 30)]},
]


def test_each_line_decodes_to_its_full_form_and_unchanged_processes_are_bare_pids() -> None:
    enc, dec = SameAsLast(), SnapshotDecoder()
    sent_kinds = []
    prev = None
    for t, poll in enumerate(POLLS):
        full = _line(float(t), copy.deepcopy(poll))
        before = copy.deepcopy(full)
        line = json.loads(encode_line(enc.encode(full)))
        assert full == before  # the worker's dict is not modified
        sent_kinds.append({g["uuid"]: [p if isinstance(p, (int, list)) else "full" for p in g["processes"]]
                           for g in line["gpus"]})
        snap = dec.decode(line)
        expected = snapshot_from_dict(json.loads(json.dumps(full)))
        assert _without_ages(snap) == _without_ages(expected)
        for a, b in zip(_since(snap), _since(expected), strict=True):  # dead since the same time, within the slack
            assert (a is None) == (b is None) and (a is None or abs(a - b) < model.AGE_SLACK_SECONDS)
        if prev is not None:  # a process sent as a bare pid is the same object as in the previous snapshot
            old = {(g.uuid, p.pid): p for g in prev.gpus for p in g.processes}
            for raw, g in zip(line["gpus"], snap.gpus, strict=True):
                for sent, p in zip(raw["processes"], g.processes, strict=True):
                    assert not isinstance(sent, int) or old[(g.uuid, sent)] is p
                    if isinstance(sent, list):
                        assert p.host_state == "gone" and p.host_state_at is not None
        prev = snap
    assert sent_kinds == [
        {"A": ["full", "full"], "B": ["full"]},
        {"A": [1, 2], "B": [3]},
        {"A": [2, "full"], "B": [3, "full"]},
        {"A": [2, "full", "full"], "B": []},  # pid 1 listed twice: sent in full, both times
        {"A": [2, "full", "full"], "B": ["full"]},  # B had no processes in the last line
        {"A": [2, "full"]},  # pid 1 was listed twice in the last line
        {"A": [2, 1], "B": ["full"]},  # B was not in the last line
        {"A": ["full", 2], "B": [3]},
        {"A": [1, 2], "B": [3]},
        {"A": ["full", 2], "B": [3]},  # died: the state changed
        {"A": [[1, 1.5], 2], "B": [3]},  # only the age moved
        {"A": [[1, 2.5], 2], "B": [3]},
        {"A": ["full", 2], "B": [3]},  # the age and the memory moved
    ]


def _without_ages(snap: Snapshot) -> Snapshot:
    return dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, processes=tuple(
        dataclasses.replace(p, host_state_seconds=None, host_state_at=None) for p in g.processes)) for g in snap.gpus))


def _since(snap: Snapshot) -> list[float | None]:
    """When each process died, on the daemon's clock, as the dead-process rule computes it."""
    return [p.host_state_at - p.host_state_seconds if p.host_state_seconds is not None and p.host_state_at is not None
            else None for g in snap.gpus for p in g.processes]


def test_a_dead_process_keeps_its_object_while_its_death_time_holds() -> None:
    enc, dec = SameAsLast(), SnapshotDecoder()

    def poll(t: float, age: float) -> ProcessSample:
        line = json.loads(encode_line(enc.encode(_line(t, {"A": [_proc(1, 10, host_state="gone",
                                                                          host_state_seconds=age)]}))))
        return dec.decode(line).gpus[0].processes[0]

    first = poll(100.0, 5.0)
    assert (first.host_state_at, first.host_state_seconds) == (100.0, 5.0)  # dead since 95
    assert poll(101.02, 5.99) is first  # the line came 30 ms late: still dead since 95 (95.03)
    assert poll(102.0, 7.0) is first
    again = poll(103.0, 0.5)  # died again (a reused pid): since 102.5
    assert again is not first and (again.host_state_at, again.host_state_seconds) == (103.0, 0.5)


def test_a_bare_pid_with_nothing_to_stand_for_is_an_unreadable_line() -> None:
    dec = SnapshotDecoder()
    dec.decode(_line(0.0, {"A": [_proc(1, 10)]}))
    with pytest.raises(ValueError, match="process 2 sent as unchanged"):
        dec.decode(_line(1.0, {"A": [1, 2]}))
    with pytest.raises(ValueError, match="process 1 sent as unchanged"):  # another GPU's pid stands for nothing
        dec.decode(_line(1.0, {"B": [1]}))
    with pytest.raises(ValueError, match="process 3 sent as aged"):
        dec.decode(_line(1.0, {"A": [[3, 2.0]]}))
    # a failed line changes nothing: the last good line is still what bare pids stand for
    assert dec.decode(_line(2.0, {"A": [1]})).gpus[0].processes == snapshot_from_dict(
        _line(0.0, {"A": [_proc(1, 10)]})).gpus[0].processes


def test_a_changed_process_with_an_unknown_key_still_fails_strict_mode() -> None:
    dec = SnapshotDecoder()
    dec.decode(_line(0.0, {"A": [_proc(1, 10)]}))
    dec.decode(_line(1.0, {"A": [1]}))
    with pytest.raises(UnknownSnapshotKey, match=r"ProcessSample\.cgroup"):
        dec.decode(_line(2.0, {"A": [_proc(1, 10, cgroup="/x")]}))


def test_the_real_worker_sends_unchanged_processes_as_pids(standin_libdir: Path, write_sim_state: Any) -> None:
    state = make_state(2)
    for g, dev in enumerate(state["devices"]):
        dev["processes"] = {"compute": [{"pid": 5000 + 100 * g + i, "used_memory": (i + 1) << 20} for i in range(4)],
                            "graphics": []}
    path = write_sim_state(state)
    w = LiveWorker(standin_libdir, path, top_n=10, **{SAME_AS_LAST: True})
    try:
        lines = [w.next() for _ in range(3)]
    finally:
        w.close()
    plain = LiveWorker(standin_libdir, path, top_n=10)
    try:
        full = plain.next()
    finally:
        plain.close()
    dec = SnapshotDecoder()
    snaps = [dec.decode(line) for line in lines]
    assert all(isinstance(p, dict) for g in lines[0]["gpus"] for p in g["processes"])
    assert [g["processes"] for g in lines[2]["gpus"]] == [[5000 + i for i in range(4)][::-1],
                                                          [5100 + i for i in range(4)][::-1]]
    expected = snapshot_from_dict({k: v for k, v in full.items() if k != "calls"})
    for snap in snaps:
        assert [g.processes for g in snap.gpus] == [g.processes for g in expected.gpus]
    assert snaps[2].gpus[0].processes is snaps[1].gpus[0].processes


def test_both_ends_name_the_same_age_field() -> None:
    assert protocol.AGE == model.AGE
    assert protocol.AGE in {f.name for f in dataclasses.fields(ProcessSample)}
