"""Snapshot JSON encoding: round trip, version skew (unknown / missing keys), tuples and nested types restored."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwatchd.model import (
    UNKNOWN_KEYS,
    GpuSample,
    LostGpu,
    ProcessSample,
    Snapshot,
    UnknownSnapshotKey,
    XidEvent,
    set_strict_snapshots,
    snapshot_from_dict,
)


@pytest.fixture
def production_mode() -> Iterator[None]:
    """Unknown keys dropped with a warning, as in production (tests/conftest.py makes the session strict)."""
    set_strict_snapshots(False)
    UNKNOWN_KEYS.clear()
    yield
    set_strict_snapshots(True)
    UNKNOWN_KEYS.clear()


def _gpu(i: int, procs: int = 3) -> GpuSample:
    """A GpuSample with every field set to a non-default value (derived from the field's type)."""
    values: dict[str, Any] = {}
    for n, f in enumerate(dataclasses.fields(GpuSample)):
        t = str(f.type)
        if f.name == "uuid":
            values[f.name] = f"GPU-{i:08x}-0000-0000-0000-000000000000"
        elif f.name == "index":
            values[f.name] = i
        elif f.name == "fan_speed_ratios":
            values[f.name] = (0.3, 0.45)
        elif f.name == "processes":
            values[f.name] = tuple(
                ProcessSample(pid=1000 + p, kind="graphics" if p % 2 else "compute", used_memory_bytes=(p + 1) << 20,
                              name=f"proc{p}", user="alice", host_rss_bytes=(p + 7) << 20,
                              utilization_percent=[p % 100, (p + 1) % 100, 0, 1], host_state="gone",
                              host_state_seconds=12.5 + p, host_state_at=1700000000.0 + p)
                for p in range(procs)
            )
        elif f.name == "errors":
            values[f.name] = {"power_watts": "timeout"}
        elif t.startswith("dict"):
            values[f.name] = {"graphics": 1.41e9 + n, "memory": 9.5e8}
        elif t.startswith("bool"):
            values[f.name] = True
        elif t.startswith("int"):
            values[f.name] = 100 + n
        elif t.startswith("float"):
            values[f.name] = 0.5 + n
        elif t.startswith("str"):
            values[f.name] = f"v{n}"
        else:
            raise AssertionError(f"test does not know how to fill {f.name}: {t}")
    return GpuSample(**values)


def full_snapshot(gpus: int = 2, procs: int = 3) -> Snapshot:
    """A Snapshot with every field (and every nested field) set to a non-default value."""
    return Snapshot(
        timestamp=1700000000.25,
        nvml_ok=True,
        nvml_error="timeout",
        driver_version="535.161.08",
        nvml_version="12.535.161.08",
        cuda_driver_version=12020,
        device_count=gpus + 1,
        gpus=tuple(_gpu(i, procs) for i in range(gpus)),
        lost=(LostGpu(index=gpus, uuid="GPU-lost", pci_bus_id="00000000:0C:00.0", reason="unknown_error"),),
        xid_events=(XidEvent(uuid="GPU-x", xid=79, timestamp=1700000000.0, source="kmsg",
                             pci_bus_id="00000000:0C:00.0", message="fallen off the bus"),),
        poll_duration_seconds=0.012,
        host_pid_namespace=True,
    )


def _wire(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as it crosses the pipe: the dataclass fields as a dict, through JSON (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(snap)))  # type: ignore[no-any-return]


def test_every_field_is_non_default() -> None:
    # Guards the round-trip test below: a field left at its default would round-trip trivially.
    snap = full_snapshot()
    for obj in (snap, snap.gpus[0], snap.gpus[0].processes[1], snap.lost[0], snap.xid_events[0]):
        for f in dataclasses.fields(obj):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert getattr(obj, f.name) != default, f"{type(obj).__name__}.{f.name} is at its default"


def test_round_trip_equal_with_every_field_set() -> None:
    snap = full_snapshot()
    back = snapshot_from_dict(_wire(snap))
    assert back == snap
    assert isinstance(back.gpus, tuple) and isinstance(back.gpus[0], GpuSample)
    assert isinstance(back.gpus[0].processes, tuple) and isinstance(back.gpus[0].processes[0], ProcessSample)
    assert isinstance(back.gpus[0].fan_speed_ratios, tuple)
    assert isinstance(back.lost, tuple) and isinstance(back.lost[0], LostGpu)
    assert isinstance(back.xid_events, tuple) and isinstance(back.xid_events[0], XidEvent)


def test_default_snapshot_round_trip() -> None:
    snap = Snapshot(timestamp=5.0, nvml_ok=False, nvml_error="driver_not_loaded")
    assert snapshot_from_dict(_wire(snap)) == snap


def _with_unknown_keys() -> dict[str, Any]:
    data = _wire(full_snapshot())
    data["future_top"] = 1
    data["gpus"][0]["future_gpu_field"] = [1, 2]
    data["gpus"][1]["processes"][0]["cgroup"] = "/user.slice"
    data["lost"][0]["extra"] = None
    data["xid_events"][0]["severity"] = "fatal"
    return data


@pytest.mark.usefixtures("production_mode")
def test_unknown_keys_dropped_at_every_level_with_one_warning_per_key(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuwatchd.model"):
        assert snapshot_from_dict(_with_unknown_keys()) == full_snapshot()
        assert snapshot_from_dict(_with_unknown_keys()) == full_snapshot()
    warned = sorted(r.args[0] for r in caplog.records)  # type: ignore[index]
    keys = ["GpuSample.future_gpu_field", "LostGpu.extra", "ProcessSample.cgroup", "Snapshot.future_top",
            "XidEvent.severity"]
    assert warned == keys
    counts = dict(UNKNOWN_KEYS)
    assert counts == dict.fromkeys(keys, 2)


def test_unknown_keys_are_an_error_in_strict_mode() -> None:
    # The test session is strict: a worker key no model field reads fails the test instead of being lost.
    for level in ("top", "gpu", "process", "lost", "xid"):
        data = _wire(full_snapshot())
        target = {"top": data, "gpu": data["gpus"][0], "process": data["gpus"][1]["processes"][0],
                  "lost": data["lost"][0], "xid": data["xid_events"][0]}[level]
        target["future_key"] = 1
        with pytest.raises(UnknownSnapshotKey, match=r"\.future_key"):
            snapshot_from_dict(data)


def test_missing_keys_take_defaults() -> None:
    data: dict[str, Any] = {
        "timestamp": 3.0,
        "nvml_ok": True,
        "gpus": [{"uuid": "GPU-a", "index": 0, "processes": [{"pid": 7}]}, {"uuid": "GPU-b", "index": 1}],
        "lost": [{"index": 2}],
        "xid_events": [{"uuid": None, "xid": 48, "timestamp": 2.0}],
    }
    snap = snapshot_from_dict(data)
    assert snap == Snapshot(
        timestamp=3.0,
        nvml_ok=True,
        gpus=(GpuSample(uuid="GPU-a", index=0, processes=(ProcessSample(pid=7),)), GpuSample(uuid="GPU-b", index=1)),
        lost=(LostGpu(index=2),),
        xid_events=(XidEvent(uuid=None, xid=48, timestamp=2.0),),
    )
    assert snap.gpus[0].clocks_hz == {} and snap.gpus[0].fan_speed_ratios is None
    assert snapshot_from_dict({"timestamp": 1.0, "nvml_ok": False}) == Snapshot(timestamp=1.0, nvml_ok=False)


def test_keys_in_another_order_decode_the_same() -> None:
    # A producer that orders keys differently (another encoder, a hand-written fixture) must decode identically.
    data = _wire(full_snapshot())
    data["gpus"] = [dict(reversed(list(g.items()))) for g in data["gpus"]]
    for g in data["gpus"]:
        g["processes"] = [dict(reversed(list(p.items()))) for p in g["processes"]]
    assert snapshot_from_dict(dict(reversed(list(data.items())))) == full_snapshot()


def test_default_dicts_are_not_shared() -> None:
    a, b = snapshot_from_dict(
        {"timestamp": 1.0, "nvml_ok": True, "gpus": [{"uuid": "a", "index": 0}, {"uuid": "b", "index": 1}]}
    ).gpus
    assert a.clocks_hz is not b.clocks_hz and a.errors is not b.errors


def test_missing_required_key_is_an_error() -> None:
    with pytest.raises(TypeError):
        snapshot_from_dict({"timestamp": 1.0, "nvml_ok": True, "gpus": [{"index": 0}]})
    with pytest.raises(TypeError):
        snapshot_from_dict({"timestamp": 1.0, "nvml_ok": True, "gpus": [{"uuid": "a", "index": 0, "processes": [{}]}]})


@pytest.mark.usefixtures("production_mode")
def test_right_number_of_keys_but_one_unknown_takes_the_default() -> None:
    # As many keys as fields, but one is from a newer worker and one field is missing: the missing one defaults.
    proc = {"pid": 7, "kind": "graphics", "used_memory_bytes": 1, "name": "x", "user": "u", "cgroup": "/a"}
    snap = snapshot_from_dict({"timestamp": 1.0, "nvml_ok": True, "gpus": [{"uuid": "a", "index": 0,
                                                                           "processes": [proc, proc]}]})
    assert snap.gpus[0].processes == (ProcessSample(7, "graphics", 1, "x", "u", None),) * 2
