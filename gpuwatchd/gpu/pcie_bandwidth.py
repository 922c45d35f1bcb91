"""What a PCIe link should carry: per-lane signalling rate, line encoding and protocol overhead (no I/O).

Raw rate per lane (GT/s) and encoding per generation are the PCI-SIG figures (gen1-2: 8b/10b, gen3-5: 128b/130b,
gen6: FLIT, 242/256). On top of that, TLP/DLLP headers and flow control leave about 80% of it for pinned
``cudaMemcpy`` payload: a healthy gen3 x16 slot gives ~12.5 of 15.75 GB/s, gen4 x16 ~25 of 31.5 GB/s.

A GPU behind a Thunderbolt 3/4 (or USB4 40G) dock gets the tunnel's PCIe Gen3 x4, whatever its own link trained
to, and the tunnel costs more: 19-22 Gb/s host-to-device is what healthy setups measure (unanswered.io "eGPU
bandwidth requirements", against the 31.504 Gb/s of 8 GT/s x4 the kernel reports for the tunnel), so its
expectation is 22 Gb/s. An eGPU is judged against its tunnel, not a desktop slot.
"""

from __future__ import annotations

from dataclasses import dataclass

GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
PROTOCOL_EFFICIENCY = 0.80
THUNDERBOLT_TUNNEL = (3, 4)  # PCIe Gen3 x4
THUNDERBOLT_BYTES_PER_SECOND = 22e9 / 8


@dataclass(frozen=True, slots=True)
class LinkExpectation:
    name: str  # "PCIe Gen3 x4", "a Thunderbolt 3/4 tunnel (PCIe Gen3 x4)"
    bytes_per_second: float


def raw_bytes_per_second(gen: int, width: int) -> float:
    """Line rate after encoding, one direction, bytes/s (gen3 x4: 3.94e9)."""
    return GT_PER_S[gen] * 1e9 * ENCODING[gen] * width / 8


TUNNEL_NAMES = {1: "Thunderbolt 1", 2: "Thunderbolt 2", 3: "Thunderbolt 3", 4: "USB4/Thunderbolt 4"}


def tunnel_name(generation: int | None) -> str:
    """The dock's Thunderbolt generation (sysfs ``generation``: 1-3 Thunderbolt, 4 USB4) as users say it."""
    return TUNNEL_NAMES.get(generation or 0, "Thunderbolt 3/4")


def expectation(gen: int | None, width: int | None, *, thunderbolt: bool = False,
                tunnel: str = "Thunderbolt 3/4") -> LinkExpectation | None:
    """What a healthy link of this generation and width delivers per direction; None when unknown."""
    if thunderbolt:
        tgen, twidth = THUNDERBOLT_TUNNEL
        own = raw_bytes_per_second(gen, width) * PROTOCOL_EFFICIENCY if gen in GT_PER_S and width else None
        rate = THUNDERBOLT_BYTES_PER_SECOND if own is None else min(own, THUNDERBOLT_BYTES_PER_SECOND)
        return LinkExpectation(f"a {tunnel} tunnel (PCIe Gen{tgen} x{twidth})", rate)
    if gen not in GT_PER_S or not width or width <= 0:
        return None
    return LinkExpectation(f"PCIe Gen{gen} x{width}", raw_bytes_per_second(gen, width) * PROTOCOL_EFFICIENCY)
