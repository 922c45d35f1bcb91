"""NVML clock event ("throttle") reason bits and the names gpuwatchd gives them.

Defined here rather than read from pynvml because pynvml's ``nvmlClocksEventReasonAll`` (0x1FF) omits the board
limit and reliability bits and spells some bits only with the old ``Throttle`` prefix (nvml.h API 13, l.3686-3848;
pynvml l.2190-2241). Bits NVIDIA adds later are named ``bit_N`` so they still show up.
"""

from __future__ import annotations

from collections.abc import Iterator

# bit value -> exported reason name (label value of gpuwatchd_gpu_clocks_event_active{reason=...})
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}

# Reasons that mean the GPU runs slower than it could because something is wrong (heat, power delivery).
# gpu_idle is normal; sw_power_cap is a configured limit; sync_boost and the settings bits are deliberate.
THROTTLE_REASONS: frozenset[str] = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})

# NVML masks are unsigned long long; bits past 63 cannot occur.
_MASK_BITS = 64


def reason_name(bit: int) -> str:
    """Name of one single-bit value: a known reason, else ``bit_N`` (N = bit position)."""
    if bit <= 0 or bit & (bit - 1):
        raise ValueError(f"not a single bit: {bit:#x}")
    return CLOCK_EVENT_REASONS.get(bit, f"bit_{bit.bit_length() - 1}")


def iter_bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first."""
    for n in range(_MASK_BITS):
        bit = 1 << n
        if mask & bit:
            yield bit


def decode(mask: int) -> list[str]:
    """Names of the reasons set in ``mask``, lowest bit first."""
    return [reason_name(b) for b in iter_bits(mask)]


def reason_states(active: int, supported: int | None) -> dict[str, bool]:
    """Reason name -> active, for every reason the GPU supports (and any active one, supported or not).

    With ``supported`` None (the driver cannot say) only the active reasons are listed: claiming "not active" for
    a reason nobody asked about would turn "unknown" into 0.
    """
    universe = (supported or 0) | active
    return {reason_name(b): bool(active & b) for b in iter_bits(universe)}
