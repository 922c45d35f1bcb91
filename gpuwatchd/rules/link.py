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
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatchd.model import GpuSample
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, Level, RuleView, fmt_duration, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.dock import dock_title
from gpuwatchd.store import GpuPoint

DEGRADED = "GpuPcieLinkDegraded"
REPLAYS = "GpuPcieReplays"

# Allowed replays per lane per minute by PCIe generation (DCGM modules/health/DcgmHealthWatch.cpp).
REPLAYS_PER_LANE_PER_MINUTE: dict[int, float] = {1: 0.15, 2: 0.3, 3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}

DEGRADED_DESCRIPTION = (
    "The PCIe link runs below its maximum generation or width while the GPU is busy, so host<->GPU transfers "
    "are slower."
)
REPLAYS_DESCRIPTION = (
    "The PCIe link retransmits packets more often than a healthy link's error rate allows: signal integrity "
    "problems (riser, cable, slot, dust, power). Rising replays often precede the GPU falling off the bus (Xid 79)."
)
REPLAYS_CLEAR_DESCRIPTION = "The link no longer retransmits more than a healthy link's error rate allows."


def replay_allowance(gen: int, width: int, window: float) -> float:
    """Replays allowed in ``window`` seconds on a gen/width link (DCGM's per-minute rule, scaled)."""
    per_lane = REPLAYS_PER_LANE_PER_MINUTE.get(gen, REPLAYS_PER_LANE_PER_MINUTE[max(REPLAYS_PER_LANE_PER_MINUTE)])
    return math.ceil(per_lane * width) * window / 60.0


@dataclass(frozen=True, slots=True)
class ReplayRate:
    """Replays over one window of the GPU's history."""

    delta: int
    span: float
    allowed: float  # replays allowed over ``span``

    @property
    def per_minute(self) -> float:
        return self.delta * 60.0 / self.span

    @property
    def over(self) -> bool:
        return self.delta > self.allowed


@dataclass(frozen=True, slots=True)
class ReplayState:
    """What the history says about a GPU's replays now (``replay_state``)."""

    now: ReplayRate
    last_over: float | None  # end of the newest window over the allowance within the horizon
    peak: float | None  # the highest replays/min of a window within the horizon (None: the counter never rose)
    quiet_since: float  # the last time the counter rose (the horizon's start when it did not)


def _rate(first: GpuPoint, last: GpuPoint, gen: int, width: int) -> ReplayRate | None:
    assert first.pcie_replay_total is not None and last.pcie_replay_total is not None
    delta = last.pcie_replay_total - first.pcie_replay_total
    if delta < 0:  # counter reset (driver reload / GPU reset): count from zero
        delta = last.pcie_replay_total
    span = last.t - first.t
    if span <= 0:
        return None
    return ReplayRate(delta, span, replay_allowance(gen, width, span))


def replay_state(points: Sequence[GpuPoint], gen: int, width: int, window: float) -> ReplayState | None:
    """The rate over the newest ``window``, the newest window over the allowance among ``points`` (oldest first,
    each with a replay count), and when the counter last rose; None with too little history for a rate."""
    if len(points) < 2:
        return None
    end = points[-1].t
    i = len(points) - 1
    while i > 0 and points[i - 1].t >= end - window:
        i -= 1
    now = _rate(points[i], points[-1], gen, width) if i < len(points) - 1 else None
    if now is None:
        return None
    quiet_since = points[0].t
    for k in range(len(points) - 1, 0, -1):
        if points[k].pcie_replay_total != points[k - 1].pcie_replay_total:
            quiet_since = points[k].t
            break
    last_over: float | None = end if now.over else None
    peak: float | None = None
    if not now.over and points[0].pcie_replay_total != points[-1].pcie_replay_total:
        # Every window ending at a point, newest first (its start only moves back): the newest over the allowance,
        # and the worst of them all.
        lo = len(points) - 1
        for j in range(len(points) - 1, 0, -1):
            while lo > 0 and points[lo - 1].t >= points[j].t - window:
                lo -= 1
            r = _rate(points[min(lo, j - 1)], points[j], gen, width)
            if r is None:
                continue
            peak = r.per_minute if peak is None else max(peak, r.per_minute)
            if r.over and last_over is None:
                last_over = points[j].t
    return ReplayState(now, last_over, peak, quiet_since)


def link_name(view: RuleView, uuid: str, bus: str | None) -> str:
    """``PCIe link 00000000:07:00.0 behind the Thunderbolt dock Razer Core X V2 (3c5e...)``, the link a replay is on."""
    d = view.gpu_docks.get(uuid)
    where = f"PCIe link {bus}" if bus else "PCIe link"
    return where + (f" behind the Thunderbolt dock {dock_title(d)} ({d.unique_id})" if d is not None else "")


def _busy(points: Sequence[GpuPoint], since: float, busy: float) -> bool:
    """The GPU was busy on average since ``since`` (traffic on the link, so no replay means a clean link)."""
    utils = [p.utilization_gpu_ratio for p in points if p.t >= since]
    if not utils or any(u is None for u in utils):
        return False
    return sum(u for u in utils if u is not None) / len(utils) >= busy


def replay_conditions(view: RuleView, g: GpuSample, now: float, config: RulesConfig) -> list[Condition]:
    """``GpuPcieReplays`` of one GPU: over the allowance (raise), holding after it with the rate now (hold), or the
    resolution's words with the rate at resolution (clear)."""
    rcfg = config.replays
    gen, width = g.pcie_link_generation, g.pcie_link_width
    if gen is None or width is None:
        return []
    points = [p for p in view.gpu_history(g.uuid, since=now - rcfg.resolve_after - rcfg.window)
              if p.pcie_replay_total is not None and p.t <= now]
    st = replay_state(points, gen, width, rcfg.window)
    if st is None:
        return []
    base = gpu_labels(view, g.uuid)
    title = gpu_title(base)
    pres = view.presence.get(g.uuid)
    link = link_name(view, g.uuid, (pres.identity.pci_bus_id if pres is not None else None) or g.pci_bus_id)
    allow = math.ceil(st.now.allowed * 60.0 / st.now.span)
    healthy = f"a healthy gen{gen} x{width} link allows {allow}/min"
    act = {advice.ACTION: advice.pcie_replays(egpu=g.uuid in view.gpu_docks)}
    rate = st.now.per_minute
    if st.now.over:
        return [Condition(
            REPLAYS, "warning", base,
            f"{title}: {st.now.delta} PCIe replays in the last {fmt_duration(st.now.span)} ({rate:.0f}/min; "
            f"{healthy}) on its {link}",
            REPLAYS_DESCRIPTION, value=rate, annotations=act,
        )]
    quiet = now - st.quiet_since
    clean = quiet >= rcfg.clean_after and _busy(points, now - rcfg.clean_after, config.link.busy_utilization)
    if st.last_over is not None and now - st.last_over < rcfg.resolve_after and not clean:
        was = f"peaked at {st.peak or 0:.0f}/min, over it until {fmt_duration(now - st.last_over)} ago"
        return [Condition(
            REPLAYS, "warning", base,
            f"{title}: PCIe replays down to {rate:.0f}/min on its {link} ({healthy}; {was}); resolves after "
            f"{fmt_duration(rcfg.resolve_after)} under the allowance or {fmt_duration(rcfg.clean_after)} without a "
            f"replay under load",
            REPLAYS_DESCRIPTION, value=rate, level="hold", annotations=act,
        )]
    why = (f"no replay for {fmt_duration(quiet)} under load" if clean
           else f"under the allowance for {fmt_duration(rcfg.resolve_after)}")
    return [Condition(
        REPLAYS, "warning", base,
        f"{title}: PCIe replays at {rate:.0f}/min on its {link}, within the {allow}/min a healthy gen{gen} x{width} "
        f"link allows ({why})",
        REPLAYS_CLEAR_DESCRIPTION, value=rate, level="clear",
    )]


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Link-degraded and replay conditions of every present GPU."""
    snap = view.latest
    if snap is None:
        return []
    lcfg = config.link
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
                        annotations={advice.ACTION: advice.link_degraded(egpu=g.uuid in view.gpu_docks)},
                        value=float(gen if low_gen and gen is not None else width or 0),
                        level=level,
                    )
                )
        out.extend(replay_conditions(view, g, now, config))
    return out
