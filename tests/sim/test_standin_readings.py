"""Every row of the simple-readings table (gpuwatchd/sim/standin_readings.def) through the real pynvml: the state
key's value, NOT_SUPPORTED when unset, a scripted error, the writer's range check, the scenario field, and the
symbol left out of a build. A new row is covered here without a test of its own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuwatchd.sim.build import build_standin
from gpuwatchd.sim.scenario_fields import check_field, device_schema, parse_path
from gpuwatchd.sim.standin_abi import READING_KEYS, READINGS, Reading, load_readings
from gpuwatchd.sim.state import encode_state, make_device, make_state

if TYPE_CHECKING:
    from conftest import Sim

_IDS = [r.symbol for r in READINGS]


def _value(r: Reading) -> int:
    """A value that shows the whole width of the out type is kept (above 2**31, and above 2**32 for 64 bits)."""
    if r.hi >= 2**63 - 1:
        return 2**40 + 7
    return 4_000_000_000 if r.hi >= 2**32 - 1 else r.hi


def test_the_table_is_read_by_both_sides() -> None:
    assert len(READINGS) >= 10
    assert len({r.symbol for r in READINGS}) == len(READINGS)
    assert READING_KEYS["power_limit_mw"] == (0, 2**32 - 1)  # two calls (enforced, management limit), one key


@pytest.mark.parametrize("row", READINGS, ids=_IDS)
def test_a_row_serves_its_state_key(sim: Sim, row: Reading) -> None:
    n = sim.nvml
    call = getattr(n, row.symbol)  # pynvml knows the symbol
    value = _value(row)
    devices = [make_device(0, **{row.key: value}), make_device(1, **{row.key: None})]
    sim.update(make_state(0, devices=devices))
    n.nvmlInit()
    a, b = sim.handles()
    assert call(a) == value
    with pytest.raises(n.NVMLError_NotSupported):
        call(b)
    devices[0]["errors"] = {row.symbol: "NO_PERMISSION"}
    sim.update(make_state(0, devices=devices))
    with pytest.raises(n.NVMLError_NoPermission):
        call(a)


@pytest.mark.parametrize("key", sorted(READING_KEYS))
def test_the_writer_and_the_scenario_check_the_range(key: str) -> None:
    lo, hi = READING_KEYS[key]
    for bad in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match=rf"devices\[0\]\.{key}: {bad} is outside {lo}\.\.{hi}"):
            encode_state(make_state(1, devices=[make_device(0, **{key: bad})]))
    schema = device_schema()
    assert check_field(parse_path(f"devices[0].{key}"), hi, schema) == hi
    with pytest.raises(ValueError, match="expected int"):
        check_field(parse_path(f"devices[*].{key}"), "high", schema)


def test_rows_left_out_of_a_build(sim: Sim, load_standin: Any) -> None:
    load_standin(build_standin(omit=_IDS))
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    for row in READINGS:
        with pytest.raises(n.NVMLError_FunctionNotFound):
            getattr(n, row.symbol)(h)
    assert n.nvmlDeviceGetTemperature(h, 0) == 31  # the rest of the library is there


def test_a_malformed_row_is_named(tmp_path: Path) -> None:
    table = tmp_path / "t.def"
    table.write_text("/* comment */\nREADING(nvmlDeviceGetY, unsigned int, y, 0, 1) /* what y is */\n"
                     "READING(nvmlDeviceGetX, unsigned int, x, 0)\n")
    with pytest.raises(ValueError, match=r"t\.def:3: expected READING\(symbol, out type, state key, min, max\)"):
        load_readings(table)
    table.write_text("READING(nvmlDeviceGetY, unsigned int, y, 0, 1) /* what y is */\n")
    assert load_readings(table) == (Reading("nvmlDeviceGetY", "unsigned int", "y", 0, 1),)
    table.write_text("READING(nvmlDeviceGetX, unsigned int, x, 0, 1)\n"
                     "READING(nvmlDeviceGetX_v2, unsigned int, x, 0, 2)\n")
    with pytest.raises(ValueError, match="serve x with different ranges"):
        load_readings(table)
