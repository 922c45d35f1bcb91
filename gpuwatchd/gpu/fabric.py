"""GPU fabric registration states and P2P status names (nvml.h ``NVML_GPU_FABRIC_STATE_*``, ``nvmlGpuP2PStatus_t``).

``failed`` is not an NVML state: it is COMPLETED with an error in the registration's ``status`` (nvml.h: the status
"must be checked only if state returns complete"), which leaves the GPU as unusable for NVLink traffic as a
registration that never ends.
"""

from __future__ import annotations

FABRIC_STATE_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_FABRIC_STATES = {1: "not_started", 2: "in_progress", FABRIC_STATE_COMPLETED: "completed"}
# The label values of gpuwatchd_gpu_fabric_state, one series each.
FABRIC_STATES = ("not_started", "in_progress", "completed", "failed")

# nvmlGpuP2PStatus_t (nvml.h), by number.
P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported", 3: "ioh_topology_not_supported",
              4: "disabled_by_regkey", 5: "not_supported", 6: "unknown"}


def fabric_state_label(state: int, status: int | None) -> str | None:
    """The ``state`` label of a GPU's fabric registration, or None for a state NVML does not name."""
    if state == FABRIC_STATE_COMPLETED and status:
        return "failed"
    return _FABRIC_STATES.get(state)
