"""The state file: validation messages, round trip, atomic replace, and the stand-in re-reading it."""

from __future__ import annotations

import copy
import ctypes
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.build import HEADERS, SOURCES
from gpuwatchd.sim.standin_abi import READINGS
from gpuwatchd.sim.state import (
    EVENT_TYPES,
    OVERRIDABLE_SYMBOLS,
    STANDIN_SYMBOLS,
    bus_id,
    encode_state,
    make_device,
    make_state,
    read_state,
    write_state,
)

if TYPE_CHECKING:
    from conftest import Sim


def _broken(path: str, value: Any) -> dict[str, Any]:
    """make_state(2) with one value replaced; ``path`` like ``devices.1.memory.total``."""
    state = make_state(2)
    node: Any = state
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parents:
        node = node[p]
    node[last] = value
    return state


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("devices.1.memory.total", "24 GB", r"devices\[1\]\.memory\.total: expected an integer"),
        ("devices.1.memory.used", 10**12, r"devices\[1\]\.memory\.used: reserved \+ used"),
        ("devices.0.uuid", None, r"devices\[0\]\.uuid: required"),
        ("devices.0.name", "two\nlines", r"devices\[0\]\.name: must be one line"),
        ("devices.0.utilization.gpu", 101, r"devices\[0\]\.utilization\.gpu: 101 is outside 0\.\.100"),
        ("devices.0.errors", {"nvmlDeviceGetPowerUsage": "EXPLODED"}, r"errors\.nvmlDeviceGetPowerUsage: unknown NVML"),
        ("devices.0.errors", {"nvmlDeviceGetPowr": "UNKNOWN"}, r"devices\[0\]\.errors\.nvmlDeviceGetPowr: unknown key"),
        ("devices.0.delays_ms", {"*": -2}, r"devices\[0\]\.delays_ms\.\*: -2 is outside"),
        ("devices.0.temprature", 40, r"devices\[0\]\.temprature: unknown key"),
        ("devices.0.processes.compute", [{"pid": 0}], r"processes\.compute\[0\]\.pid: 0 is outside"),
        ("devices.0.pstate", 20, r"devices\[0\]\.pstate: expected 0\.\.15 or 32"),
        ("devices.0.fans", 30, r"devices\[0\]\.fans: expected a list"),
        ("devices.0.lost", "yes", r"devices\[0\]\.lost: expected a boolean"),
        ("init_error", "BROKEN", r"init_error: unknown NVML error"),
        ("events", [{"seq": 1, "uuid": "GPU-x", "type": "boom"}], r"events\[0\]\.type: unknown event type"),
        ("events", [{"seq": 2, "uuid": "GPU-x", "type": "xid"}, {"seq": 2, "uuid": "GPU-x", "type": "xid"}],
         r"events\[1\]\.seq: must strictly increase"),
    ],
)  # fmt: skip
def test_validation_names_the_key_path(tmp_path: Path, path: str, value: Any, message: str) -> None:
    target = tmp_path / "state"
    write_state(target, make_state(1))
    before = target.read_bytes()
    with pytest.raises(ValueError, match=message):
        write_state(target, _broken(path, value))
    assert target.read_bytes() == before  # a rejected state never touches the file
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # and leaves no temp file behind


def test_unknown_top_level_key_rejected() -> None:
    with pytest.raises(ValueError, match=r"^driver_verison: unknown key"):
        encode_state(make_state(1, driver_verison="1.0"))


def test_duplicate_uuid_rejected() -> None:
    state = make_state(2)
    state["devices"][1]["uuid"] = state["devices"][0]["uuid"]
    with pytest.raises(ValueError, match=r"devices\[1\]\.uuid: duplicate of devices\[0\]\.uuid"):
        encode_state(state)


def test_round_trip_and_private_keys(tmp_path: Path) -> None:
    state = make_state(3, _scenario="leak")
    state["devices"][2]["processes"]["compute"] = [{"pid": 9, "used_memory": None, "name": "x", "host_rss": 5}]
    state["events"] = [{"seq": 1, "uuid": state["devices"][0]["uuid"], "type": "xid", "data": 79}]
    original = copy.deepcopy(state)
    write_state(tmp_path / "s", state)
    assert read_state(tmp_path / "s") == original
    assert state == original  # the writer does not mutate its input


def test_read_state_rejects_a_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("hello\n")
    with pytest.raises(ValueError, match="not a complete stand-in state file"):
        read_state(tmp_path / "s")


def test_builders_and_bus_id() -> None:
    devs = make_state(250)["devices"]
    assert len({d["uuid"] for d in devs}) == 250
    assert len({bus_id(d["pci"]) for d in devs}) == 250  # distinct PCI addresses even past one bus range
    assert bus_id({"domain": 0, "bus": 12, "device": 0}) == "00000000:0C:00.0"
    assert make_device(1, temperature=80)["temperature"] == 80
    encode_state(make_state(250))  # valid as built


def test_symbol_tables_match_the_c_source() -> None:
    table = {r.symbol for r in READINGS}  # standin_readings.def's getters are generated (test_standin_readings.py)
    hand_written = set(re.findall(r"#ifndef OMIT_(\w+)", "".join(p.read_text() for p in SOURCES)))
    assert not hand_written & table
    assert hand_written | table == set(STANDIN_SYMBOLS)
    funcs = re.search(r"#define FUNCS\(X\)(.*?)\n\n", HEADERS[0].read_text(), re.S)
    assert funcs is not None
    assert set(re.findall(r"X\((\w+)\)", funcs.group(1))) | table == set(OVERRIDABLE_SYMBOLS)


def test_event_bits_are_nvmls() -> None:
    import pynvml

    assert {
        "sbe": pynvml.nvmlEventTypeSingleBitEccError,
        "dbe": pynvml.nvmlEventTypeDoubleBitEccError,
        "pstate": pynvml.nvmlEventTypePState,
        "xid": pynvml.nvmlEventTypeXidCriticalError,
        "clock": pynvml.nvmlEventTypeClock,
        "power_source": pynvml.nvmlEventTypePowerSourceChange,
    } == EVENT_TYPES


def test_every_symbol_is_exported(standin_libdir: Path) -> None:
    lib = ctypes.CDLL(str(standin_libdir / "libnvidia-ml.so.1"))
    missing = [s for s in sorted(STANDIN_SYMBOLS) if not hasattr(lib, s)]
    assert missing == []
    assert not hasattr(lib, "parse_state")  # internals stay hidden


def test_state_reread_after_atomic_replace(sim: Sim) -> None:
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    for watts in (70, 300, 125):
        state = make_state(2)
        state["devices"][0]["power_usage_mw"] = watts * 1000
        sim.update(state)
        assert n.nvmlDeviceGetPowerUsage(h) == watts * 1000


@pytest.mark.parametrize(
    "garbage",
    [b"", b"GWSIM 1\ndevice\nuuid GPU-x\n", b"not a state\nEND\n", b"GWSIM 1\nbogus\ndevice\nmemory 1 x 2\nEND\n",
     b"\x00\xff" * 100],
)  # fmt: skip
def test_garbage_state_keeps_the_old_one(sim: Sim, garbage: bytes) -> None:
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    tmp = sim.path.with_name("garbage")
    tmp.write_bytes(garbage)
    tmp.replace(sim.path)

    time.sleep(0.01)
    assert n.nvmlDeviceGetPowerUsage(h) == 25000
    assert n.nvmlDeviceGetCount() == 2
    state = make_state(2)
    state["devices"][0]["power_usage_mw"] = 1000
    sim.update(state)  # a good file afterwards is picked up again
    assert n.nvmlDeviceGetPowerUsage(h) == 1000
