"""The daemon's side of the per-GPU health state: gather each GPU's facts from the store, assess, hand the result
to the store (``Store.ingest``, kept in ``Store.health``) for ``/metrics``, ``/api/v1/status`` and
``gpuwatchd status`` (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuwatchd.gpu.health import GpuFacts, assess, health_actions, with_parent
from gpuwatchd.model import Alert, HealthChange
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.model.probes import FAILED
from gpuwatchd.store import Store


def gpu_facts(store: Store) -> dict[str, GpuFacts]:
    """The facts of every device the daemon has seen: GPUs and MIG devices (``mig_parents`` tells them apart)."""
    snap = store.latest
    sampled = {g.uuid for g in snap.gpus} if snap is not None and not store.stale else set()
    failed: dict[str, str] = {}
    for (uuid, probe), rec in sorted(store.probes.last.items()):
        if rec.result in FAILED and uuid not in failed:
            failed[uuid] = f"{probe} {rec.result}" + (f": {rec.problem}" if rec.problem else "")
    out = {}
    for uuid, pres in store.presence.items():
        # A MIG device sits behind its GPU's dock, if any; probes run on the GPU (its verdict reaches the MIG
        # device through the GPU's health, with_parent).
        host = pres.identity.parent_uuid or uuid
        dock = store.gpu_docks.get(host)
        out[uuid] = GpuFacts(pres.state, uuid in sampled, dock is not None,
                             failed.get(uuid) if host == uuid else None, dock.unique_id if dock else None)
    return out


def mig_parents(store: Store) -> dict[str, str]:
    """MIG device uuid -> the uuid of the GPU it is part of."""
    return {u: p.identity.parent_uuid for u, p in store.presence.items() if p.identity.parent_uuid is not None}


def update_health(store: Store, alerts: Iterable[Alert], now: float) -> dict[str, GpuHealth]:
    """Every GPU's and MIG device's health (a MIG device's is its own or its GPU's when that is worse: without it a
    MIG device stayed "unknown" for good), into the store."""
    snap = store.latest
    nvml_ok = snap is not None and snap.nvml_ok and not store.stale
    previous = store.health
    health = assess(gpu_facts(store), alerts, now, previous, nvml_ok=nvml_ok, xid_actions=health_actions())
    for mig, parent in mig_parents(store).items():
        if mig in health:
            health[mig] = with_parent(health[mig], health.get(parent), parent, previous.get(mig), now)
    store.ingest(HealthChange(health))
    return store.health
