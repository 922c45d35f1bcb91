"""Clock event reason names: the documented bits, bit_N for the rest, supported-mask handling."""

from __future__ import annotations

import pytest

from gpuwatchd.gpu.clock_events import CLOCK_EVENT_REASONS, THROTTLE_REASONS, decode, reason_name, reason_states


def test_table_matches_nvml_h() -> None:
    # nvml.h API 13 (nvml-egpu.md §1.2): 11 bits from 0x1 to 0x400, names unique
    assert sorted(CLOCK_EVENT_REASONS) == [1 << n for n in range(11)]
    assert len(set(CLOCK_EVENT_REASONS.values())) == 11
    assert CLOCK_EVENT_REASONS[0x80] == "hw_power_brake"
    assert set(CLOCK_EVENT_REASONS.values()) >= THROTTLE_REASONS


def test_decode_names_unknown_bits_by_position() -> None:
    assert decode(0) == []
    assert decode(0x1 | 0x8 | 0x800 | (1 << 40)) == ["gpu_idle", "hw_slowdown", "bit_11", "bit_40"]


def test_reason_name_rejects_non_single_bits() -> None:
    with pytest.raises(ValueError, match="single bit"):
        reason_name(0x3)
    with pytest.raises(ValueError, match="single bit"):
        reason_name(0)


def test_reason_states_lists_supported_and_active() -> None:
    states = reason_states(0x20 | 0x1000, 0x1FF)
    assert len(states) == 10  # 9 supported bits + the unsupported-but-active bit 12
    assert states["sw_thermal"] is True and states["bit_12"] is True
    assert states["gpu_idle"] is False
    assert "board_limit" not in states


def test_reason_states_without_supported_mask_lists_only_active() -> None:
    assert reason_states(0x4, None) == {"sw_power_cap": True}
    assert reason_states(0, None) == {}
