"""A GPU's health state as a value: what ``gpuwatchd.gpu.health`` derives and the store, the exporter, the status
page and the events carry (here so the model needs nothing from ``gpu/``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HealthState = Literal["healthy", "degraded", "unhealthy", "unknown"]
HealthAction = Literal["none", "restart_app", "reset_gpu", "reboot", "inspect_hardware", "check_cable"]

# The alert annotation holding its advice, the one text every surface shows for the fault (rules/advice.py).
ADVICE = "action"

STATES: tuple[HealthState, ...] = ("healthy", "degraded", "unhealthy", "unknown")
ACTIONS: tuple[HealthAction, ...] = ("none", "restart_app", "check_cable", "reset_gpu", "inspect_hardware", "reboot")

ACTION_TEXT: dict[HealthAction, str] = {
    "none": "nothing to do",
    "restart_app": "restart the application on the GPU",
    "reset_gpu": "reset the GPU (stop its processes, then nvidia-smi -r -i <index>)",
    "reboot": "reboot the machine",
    "inspect_hardware": "reseat and inspect the GPU (power cables, slot, riser, cooling)",
    "check_cable": "check the eGPU's cable, dock and enclosure power, then re-plug it",
}


@dataclass(frozen=True, slots=True)
class GpuHealth:
    state: HealthState
    reason: str
    action: HealthAction
    since: float  # when the GPU entered this state (daemon clock)
    evidence: tuple[str, ...] = ()  # alertnames (and "probe") behind the state
    # What to do, in words: the advice of the alert the state rests on (the same text chat got), else the action's.
    advice: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "reason": self.reason, "action": self.action,
                "action_text": self.advice or ACTION_TEXT[self.action], "since": self.since,
                "evidence": list(self.evidence)}
