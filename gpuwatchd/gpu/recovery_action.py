"""The GPU recovery action the driver asks for (nvml.h ``nvmlDeviceGpuRecoveryAction_t``; no I/O, no pynvml).

Read from field value ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (R565+; it supersedes ``NVML_FI_DEV_RESET_STATUS`` and
``NVML_FI_DEV_DRAIN_AND_RESET_STATUS``); the kernel log says the same as Xid 154 ("GPU recovery action changed").
Severity follows DCGM's DRIVER health watch (``DcgmHealthWatch.cpp``): GPU reset, node reboot, drain and reset ->
FAIL, drain P2P -> WARN; the values nvml.h added later are judged the same way (a reset or reboot fails, a drain or
a fabric-domain recovery warns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    value: int  # nvmlDeviceGpuRecoveryAction_t
    label: str  # the exported ``action`` label
    what: str  # what the driver asks for, for messages
    severity: Literal["warning", "critical"]
    todo: str  # what to do


_DRAIN = "Let the GPU's jobs finish or move them elsewhere (drain the node in the scheduler), then "
ACTIONS: dict[int, RecoveryAction] = {a.value: a for a in (
    RecoveryAction(0, "none", "no recovery action", "warning", ""),
    RecoveryAction(1, "gpu_reset", "a GPU reset", "critical",
                   _DRAIN + "reset the GPU (nvidia-smi -r -i <index>) or reboot the node."),
    RecoveryAction(2, "node_reboot", "a node reboot", "critical",
                   _DRAIN + "reboot the node: a GPU reset is not enough."),
    RecoveryAction(3, "drain_p2p", "a drain of peer-to-peer traffic", "warning",
                   "Stop jobs that use peer-to-peer (NVLink/P2P) transfers on this GPU; NVML reports the action "
                   "cleared once the driver no longer needs it."),
    RecoveryAction(4, "drain_and_reset", "a drain and a GPU reset", "critical",
                   "Stop peer-to-peer traffic and " + _DRAIN[0].lower() + _DRAIN[1:]
                   + "reset the GPU (nvidia-smi -r -i <index>)."),
    RecoveryAction(5, "recover_imex_domain", "a recovery of its IMEX domain", "warning",
                   "Recover the NVLink multi-node (IMEX) domain this GPU belongs to (restart the IMEX daemons "
                   "of the domain)."),
    RecoveryAction(6, "bus_reset", "a reset of its PCIe bus", "critical",
                   _DRAIN + "reset the GPU's PCIe bus (a secondary bus reset) or reboot the node."),
    RecoveryAction(7, "system_reboot", "a system reboot", "critical", _DRAIN + "reboot the system."),
)}


def recovery_action(value: int) -> RecoveryAction:
    """The action for an NVML value; a value newer than this table is still an action to take."""
    known = ACTIONS.get(value)
    if known is not None:
        return known
    return RecoveryAction(value, f"unknown_{value}", f"recovery action {value} (unknown to this gpuwatchd)", "critical",
                          "Check the driver's documentation of nvmlDeviceGpuRecoveryAction_t for this value.")
