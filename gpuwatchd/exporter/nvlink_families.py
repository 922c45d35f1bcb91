"""NVLink per link and the GPU recovery action, from the ``GpuSample``s of present GPUs.

Per-link series carry a ``link`` label (the NVML link number). A GPU without NVLink, and a counter the driver does
not serve, have no series (never 0 for unknown). The recovery action is one gauge per GPU whose value is NVML's
number and whose ``action`` label names it, so ``gpuwatchd_gpu_recovery_action > 0`` alerts and the label reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.gpu.recovery_action import recovery_action
from gpuwatchd.model import GpuSample

_L = ("uuid", "link")

NVLINK_STATE = spec(
    "gpuwatchd_gpu_nvlink_state", "gauge", "1 when the NVLink link is up (enabled), 0 when it is down.", _L
)
NVLINK_ERRORS = spec(
    "gpuwatchd_gpu_nvlink_errors_total", "counter",
    "NVLink errors on one link, by type=crc_flit|crc_data|replay|recovery; rising = a marginal link.",
    ("uuid", "link", "type"),
)
NVLINK_DATA = spec(
    "gpuwatchd_gpu_nvlink_data_bytes_total", "counter",
    "NVLink payload bytes on one link by direction=tx|rx (without protocol overhead); rate() gives the throughput.",
    ("uuid", "link", "direction"), "bytes",
)
RECOVERY_ACTION = spec(
    "gpuwatchd_gpu_recovery_action", "gauge",
    "The recovery action the driver asks for (nvmlDeviceGpuRecoveryAction_t: 0 none, 1 gpu_reset, 2 node_reboot, "
    "3 drain_p2p, 4 drain_and_reset, 5 recover_imex_domain, 6 bus_reset, 7 system_reboot), named by the action label.",
    ("uuid", "action"),
)


def nvlink_families(gpus: Iterable[GpuSample]) -> list[Metric]:
    """Per-link state, errors and data bytes, and the recovery action."""
    f = Families()
    for g in gpus:
        for link, up in sorted(g.nvlink_states.items(), key=lambda kv: int(kv[0])):
            f.add(NVLINK_STATE, (g.uuid, link), up)
        for link, kinds in sorted(g.nvlink_errors_total.items(), key=lambda kv: int(kv[0])):
            for kind, count in sorted(kinds.items()):
                f.add(NVLINK_ERRORS, (g.uuid, link, kind), count)
        for direction, per_link in (("tx", g.nvlink_transmit_bytes_total), ("rx", g.nvlink_receive_bytes_total)):
            for link, count in sorted(per_link.items(), key=lambda kv: int(kv[0])):
                f.add(NVLINK_DATA, (g.uuid, link, direction), count)
        if g.recovery_action is not None:
            f.add(RECOVERY_ACTION, (g.uuid, recovery_action(g.recovery_action).label), g.recovery_action)
    return f.metrics()
