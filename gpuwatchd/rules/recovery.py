"""``GpuRecoveryActionRequired``: the driver asks for a GPU reset, a reboot or a drain (one alert per GPU).

The action is NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field; its meaning and severity (DCGM's DRIVER health
watch) are in ``gpuwatchd/gpu/recovery_action.py``. It clears when the driver reports no action again.
"""

from __future__ import annotations

from gpuwatchd.gpu.recovery_action import recovery_action
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuRecoveryActionRequired"


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per present GPU whose recovery action is not none."""
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        if g.recovery_action is None:
            continue
        base = gpu_labels(view, g.uuid)
        if g.recovery_action == 0:  # the resolution's message (matched by uuid: the alert carries its action)
            out.append(Condition(NAME, "critical", {**base, "action": "none"},
                                 f"{gpu_title(base)}: the driver asks for no recovery action any more",
                                 "The GPU was recovered (reset, reboot or drain done).", value=0.0, level="clear"))
            continue
        a = recovery_action(g.recovery_action)
        out.append(Condition(
            NAME, a.severity, {**base, "action": a.label},
            f"{gpu_title(base)}: the driver asks for {a.what} (NVML recovery action {a.value}, {a.label})",
            "The driver sets this when the GPU cannot go on without it; it clears once done.",
            value=float(a.value),
            annotations={advice.ACTION: a.todo.replace("<index>", base.get("gpu") or "<index>")},
        ))
    return out
