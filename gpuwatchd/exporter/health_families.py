"""``gpuwatchd_gpu_health_state{uuid,state}``: the per-GPU health state (gpuwatchd/gpu/health.py), one series per
state, 1 on the current one and 0 on the others (the kube-state-metrics "status" idiom), so
``gpuwatchd_gpu_health_state{state="unhealthy"} == 1`` selects the unhealthy GPUs and a state change never leaves
a stale series behind."""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwatchd.exporter.families import Families, spec
from gpuwatchd.model.health import STATES
from gpuwatchd.store import Store

HEALTH_STATE = spec(
    "gpuwatchd_gpu_health_state", "gauge",
    "1 on the GPU's current health state (healthy, degraded, unhealthy, unknown), 0 on the others; the reason and "
    "the suggested action are in /api/v1/status and gpuwatchd status.", ("uuid", "state"))


def health_families(store: Store) -> list[Metric]:
    f = Families()
    for uuid, h in sorted(store.health.items()):
        for state in STATES:
            f.add(HEALTH_STATE, (uuid, state), h.state == state)
    return f.metrics()
