"""``GpuFabricNotReady``: a GPU of an NVLink fabric (NVSwitch systems) whose registration with the fabric has not
completed, or completed with an error (one alert per GPU).

Until the Fabric Manager has registered a GPU, CUDA fails or falls back for NVLink peer traffic on it (NVIDIA Fabric
Manager user guide: a GPU not in the fabric is unusable for multi-GPU jobs); NVSentinel's users report one that went
unseen for 20 days. Registration takes seconds at boot, so the rule's ``for`` (2 min) covers it; a GPU outside any
fabric (PCIe, laptops) has no fabric state and never alerts.
"""

from __future__ import annotations

from gpuwatchd.gpu.fabric import fabric_state_label
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuFabricNotReady"
DESCRIPTION = (
    "The GPU is not registered with the NVLink fabric, so NVLink peer traffic (NCCL all-reduce across the node) "
    "fails or falls back to PCIe. Check the Fabric Manager: `systemctl status nvidia-fabricmanager` and "
    "/var/log/fabricmanager.log; `nvidia-smi -q -i <index> | grep -A3 Fabric` shows the state. A restart of the "
    "service (or a reboot after a driver update with a mismatched Fabric Manager version) usually registers it."
)
_WORDS = {"not_started": "has not started registering", "in_progress": "is still registering",
          "failed": "failed to register"}


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """One condition per present GPU with a fabric state: a raise while not completed, a clear once completed."""
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        if g.fabric_state is None:
            continue
        state = fabric_state_label(g.fabric_state, g.fabric_status)
        if state is None:
            continue
        base = gpu_labels(view, g.uuid)
        desc = DESCRIPTION.replace("<index>", base.get("gpu") or "<index>")
        if state == "completed":
            out.append(Condition(NAME, "critical", base, f"{gpu_title(base)}: registered with the NVLink fabric",
                                 desc, value=0.0, level="clear"))
            continue
        detail = f" (NVML status {g.fabric_status})" if state == "failed" else ""
        out.append(Condition(
            NAME, "critical", base,
            f"{gpu_title(base)}: {_WORDS[state]} with the NVLink fabric{detail}", desc, value=float(g.fabric_state),
        ))
    return out
