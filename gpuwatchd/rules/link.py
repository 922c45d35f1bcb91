"""``GpuPcieLinkDegraded`` (link below its maximum while busy) and ``GpuPcieReplays`` (replay rate too high).

An idle GPU lowers its PCIe link generation on purpose to save power (captures xml04 and xml13: gen1 x8 of a
gen4 x16 link at idle), so a degraded link only counts while the GPU is busy; under load the link trains back
to its maximum within seconds. A link that stays low under load is a bad riser/slot/cable, a BIOS lane setting
or, on an eGPU, the Thunderbolt tunnel (which caps at about gen3 x4).

Replays: DCGM's PCIe health watch warns when replays in a minute exceed ``ceil(rate_per_lane(gen) x width)``
with the per-lane allowance derived from a 1e-12 bit error rate (DCGM ``modules/health/DcgmHealthWatch.cpp``).
"""

from __future__ import annotations

import math

from gpuwatchd.rules.condition import Condition, Level, RuleView, fmt_duration, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

DEGRADED = "GpuPcieLinkDegraded"
REPLAYS = "GpuPcieReplays"

# Allowed replays per lane per minute by PCIe generation (DCGM modules/health/DcgmHealthWatch.cpp).
REPLAYS_PER_LANE_PER_MINUTE: dict[int, float] = {1: 0.15, 2: 0.3, 3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}

DEGRADED_DESCRIPTION = (
    "The PCIe link runs below its maximum generation or width while the GPU is busy, so host<->GPU transfers "
    "are slower. Reseat the card or riser, check the slot's lane setting in the BIOS and the slot itself; on an "
    "eGPU this can be the Thunderbolt link's limit — check the cable and the port."
)
REPLAYS_DESCRIPTION = (
    "The PCIe link retransmits packets more often than a healthy link's error rate allows: signal integrity "
    "problems (riser, cable, slot, dust, power). Reseat the card or riser and the cables; on an eGPU try another "
    "cable or port. Rising replays often precede the GPU falling off the bus (Xid 79)."
)


def replay_allowance(gen: int, width: int, window: float) -> float:
    """Replays allowed in ``window`` seconds on a gen/width link (DCGM's per-minute rule, scaled)."""
    per_lane = REPLAYS_PER_LANE_PER_MINUTE.get(gen, REPLAYS_PER_LANE_PER_MINUTE[max(REPLAYS_PER_LANE_PER_MINUTE)])
    return math.ceil(per_lane * width) * window / 60.0


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Link-degraded and replay conditions of every present GPU."""
    snap = view.latest
    if snap is None:
        return []
    lcfg, rcfg = config.link, config.replays
    out: list[Condition] = []
    for g in snap.gpus:
        base = gpu_labels(view, g.uuid)
        title = gpu_title(base)
        gen, max_gen, width, max_width = (
            g.pcie_link_generation, g.pcie_link_max_generation, g.pcie_link_width, g.pcie_link_max_width
        )
        util = g.utilization_gpu_ratio
        low_gen = gen is not None and max_gen is not None and gen < max_gen
        low_width = width is not None and max_width is not None and width < max_width
        if (low_gen or low_width) and util is not None:
            level: Level | None = (
                "raise" if util >= lcfg.busy_utilization else "hold" if util >= lcfg.clear_utilization else None
            )
            if level is not None:
                out.append(
                    Condition(
                        DEGRADED,
                        "warning",
                        base,
                        f"{title}: PCIe link at gen{gen} x{width} of gen{max_gen} x{max_width} "
                        f"while {util * 100:.0f}% busy",
                        DEGRADED_DESCRIPTION,
                        value=float(gen if low_gen and gen is not None else width or 0),
                        level=level,
                    )
                )
        window = [p for p in view.gpu_history(g.uuid, since=now - rcfg.window)
                  if p.pcie_replay_total is not None and p.t <= now]
        if len(window) < 2 or gen is None or width is None:
            continue
        first, last = window[0], window[-1]
        assert first.pcie_replay_total is not None and last.pcie_replay_total is not None
        delta = last.pcie_replay_total - first.pcie_replay_total
        if delta < 0:  # counter reset (driver reload / GPU reset): count from zero
            delta = last.pcie_replay_total
        span = last.t - first.t
        if span <= 0:
            continue
        allowed = replay_allowance(gen, width, span)
        if delta > allowed:
            per_min = delta * 60.0 / span
            out.append(
                Condition(
                    REPLAYS,
                    "warning",
                    base,
                    f"{title}: {delta} PCIe replays in the last {fmt_duration(span)} ({per_min:.0f}/min; a "
                    f"healthy gen{gen} x{width} link allows {math.ceil(allowed * 60.0 / span)}/min)",
                    REPLAYS_DESCRIPTION,
                    value=per_min,
                )
            )
    return out
