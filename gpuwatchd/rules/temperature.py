"""``GpuTemperatureHigh``: GPU temperature within ``margin`` °C of the driver's HW slowdown threshold.

The threshold is the board's own (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), so one rule fits every model; a GPU
that does not report it gets no alert rather than a guessed limit. Hysteresis: once raised, the alert holds
until the temperature drops below ``slowdown - clear_margin``.
"""

from __future__ import annotations

from gpuwatchd.rules.condition import Condition, Level, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuTemperatureHigh"

DESCRIPTION = (
    "The GPU is close to the temperature at which the hardware halves its clocks."
)


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per present GPU above the raise (or, for hysteresis, the clear) threshold."""
    cfg = config.temperature
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        temp, slowdown = g.temperature_celsius, g.temperature_slowdown_celsius
        if temp is None or slowdown is None:
            continue
        level: Level
        if temp >= slowdown - cfg.margin_celsius:
            level = "raise"
        elif temp > slowdown - cfg.clear_margin_celsius:
            level = "hold"
        else:
            continue
        base = gpu_labels(view, g.uuid)
        out.append(
            Condition(
                NAME,
                "warning",
                base,
                f"{gpu_title(base)}: {temp:.0f} °C, {slowdown - temp:.0f} °C below its slowdown threshold "
                f"({slowdown:.0f} °C)",
                DESCRIPTION,
                value=temp,
                level=level,
            )
        )
    return out
