"""GPU fabric registration and P2P status between GPU pairs, from the ``GpuSample``s of present GPUs.

A GPU outside any fabric (PCIe boards, laptops) and a host with one GPU have no series here.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.gpu.fabric import FABRIC_STATES, fabric_state_label
from gpuwatchd.model import GpuSample

FABRIC_STATE = spec(
    "gpuwatchd_gpu_fabric_state", "gauge",
    "1 on the GPU's NVLink fabric registration state (not_started, in_progress, completed, failed = completed with "
    "an error status), 0 on the others; nvmlDeviceGetGpuFabricInfoV. Only GPUs of a fabric (NVSwitch systems).",
    ("uuid", "state"),
)
P2P_STATUS = spec(
    "gpuwatchd_gpu_p2p_status", "gauge",
    "nvmlDeviceGetP2PStatus from this GPU to peer_uuid for capability=read|write|nvlink: 0 ok, 1 chipset not "
    "supported, 2 GPU not supported, 3 IOH topology not supported, 4 disabled by regkey, 5 not supported, 6 unknown.",
    ("uuid", "peer_uuid", "capability"),
)


def fabric_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """The fabric state (one series per state) and the P2P status of each pair and capability."""
    f = Families()
    for g in gpus:
        if g.fabric_state is not None:
            current = fabric_state_label(g.fabric_state, g.fabric_status)
            if current is not None:
                for state in FABRIC_STATES:
                    f.add(FABRIC_STATE, (g.uuid, state), state == current)
        for peer, caps in sorted(g.p2p_status.items()):
            for cap, status in sorted(caps.items()):
                f.add(P2P_STATUS, (g.uuid, peer, cap), status)
    return f.metrics()
