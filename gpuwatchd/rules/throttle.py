"""``GpuThrottled``: a harmful clocks-event reason active in most recent samples, one alert per reason.

Harmful: HW slowdown, HW thermal, HW power brake, SW thermal (``gpuwatchd.gpu.clock_events.THROTTLE_REASONS``).
SW power cap is the board holding its configured power limit, which is normal at full load and which some
boards even report at idle (capture xml08: RTX 3090 at P8 with sw_power_cap active), so it alerts only when
``rules.throttle.sw_power_cap`` is on *and* the GPU is busy in that sample. GPU idle, application/display clock
settings and sync boost are never alerts. gpud uses a rate over a window for the same reason (leptonai/gpud
``components/accelerator/nvidia/hw-slowdown/component.go``).

The share of time throttled in the message comes from NVML's violation counters (cumulative seconds per perf
policy) where the driver has them, else from the share of samples with the bit set.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatchd.gpu.clock_events import CLOCK_EVENT_REASONS, THROTTLE_REASONS
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, Level, RuleView, fmt_duration, fmt_share, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig, ThrottleRule
from gpuwatchd.store import GpuPoint

NAME = "GpuThrottled"
BITS: dict[str, int] = {name: bit for bit, name in CLOCK_EVENT_REASONS.items()}
HARMFUL_BITS = sum({BITS[name] for name in [*THROTTLE_REASONS, "sw_power_cap"]})

# reason -> (human name, NVML perf-policy violation counter that measures it)
REASON_INFO: dict[str, tuple[str, str | None]] = {
    "hw_slowdown": ("HW slowdown", None),  # thermal, power brake or power fast-trigger: no single counter
    "hw_thermal": ("HW thermal slowdown", "thermal"),
    "sw_thermal": ("SW thermal slowdown", "thermal"),
    "hw_power_brake": ("HW power brake slowdown", "power"),
    "sw_power_cap": ("SW power cap", "power"),
}

DESCRIPTIONS: dict[str, str] = {
    "hw_slowdown": (
        "The GPU hardware cut its clocks by half or more: overheating, an external power-brake signal or a power "
        "supply that cannot keep up."
    ),
    "hw_thermal": "The GPU is hot enough that the hardware slows it down.",
    "sw_thermal": (
        "The driver lowers clocks to stay under the GPU's temperature target; persistent thermal throttling "
        "shortens jobs' throughput."
    ),
    "hw_power_brake": "An external power-brake signal slows the GPU: the system or PSU asks it to draw less power.",
    "sw_power_cap": "The GPU runs at its power limit while busy, so clocks are held below maximum.",
}


def _active(p: GpuPoint, bit: int, name: str, cfg: ThrottleRule) -> bool | None:
    if p.clocks_event_reasons is None:
        return None
    on = bool(p.clocks_event_reasons & bit)
    if on and name == "sw_power_cap":
        util = p.utilization_gpu_ratio
        return util is not None and util >= cfg.busy_utilization
    return on


def _share(points: Sequence[GpuPoint], bit: int, name: str, cfg: ThrottleRule) -> float | None:
    flags = [f for f in (_active(p, bit, name, cfg) for p in points) if f is not None]
    return sum(flags) / len(flags) if flags else None


def _violation_share(points: Sequence[GpuPoint], counter: str) -> float | None:
    """Share of wall time the counter grew over the points' span; None without two readings or on a reset."""
    readings = [(p.t, p.violation_seconds[counter]) for p in points if counter in p.violation_seconds]
    if len(readings) < 2:
        return None
    (t0, v0), (t1, v1) = readings[0], readings[-1]
    if t1 <= t0 or v1 < v0:
        return None
    return min(1.0, (v1 - v0) / (t1 - t0))


def reasons_considered(cfg: ThrottleRule) -> list[str]:
    """Reason names this config alerts on."""
    names = sorted(THROTTLE_REASONS)
    return [*names, "sw_power_cap"] if cfg.sw_power_cap else names


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per (present GPU, harmful reason) with a share of samples at or above the thresholds."""
    cfg = config.throttle
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        hist = view.gpu_history(g.uuid, since=now - max(cfg.window, cfg.report_window))
        recent = [p for p in hist if now - cfg.window <= p.t <= now]
        report = [p for p in hist if now - cfg.report_window <= p.t <= now]
        if not recent:
            continue
        seen = 0  # every bit set in a recent sample: a reason none of them has is a share of 0 (or None), no alert
        for p in recent:
            seen |= p.clocks_event_reasons or 0
        if not seen & HARMFUL_BITS:
            continue
        base = gpu_labels(view, g.uuid)
        for name in reasons_considered(cfg):
            bit = BITS[name]
            if not seen & bit:
                continue
            share = _share(recent, bit, name, cfg)
            if share is None:
                continue
            level: Level
            if share >= cfg.min_share:
                level = "raise"
            elif share > cfg.clear_share:
                level = "hold"
            else:
                continue
            human, counter = REASON_INFO[name]
            span = (report[-1].t - report[0].t) if len(report) > 1 else 0.0
            measured = _violation_share(report, counter) if counter else None
            source = f"{counter} violation counter"
            if measured is None:
                measured = _share(report, bit, name, cfg) or 0.0
                source = "samples"
            extras = []
            if g.temperature_celsius is not None:
                extras.append(f"{g.temperature_celsius:.0f} °C")
            if g.power_watts is not None:
                extras.append(f"{g.power_watts:.0f} W")
            if g.utilization_gpu_ratio is not None:
                extras.append(f"{g.utilization_gpu_ratio * 100:.0f}% busy")
            tail = f" ({', '.join(extras)})" if extras else ""
            out.append(
                Condition(
                    NAME,
                    "warning",
                    {**base, "reason": name},
                    f"{gpu_title(base)}: {human} {fmt_share(measured)} of the last {fmt_duration(span)}{tail}",
                    DESCRIPTIONS[name],
                    value=measured,
                    level=level,
                    annotations={"share_source": source, advice.ACTION: advice.THROTTLE[name]},
                )
            )
    return out
