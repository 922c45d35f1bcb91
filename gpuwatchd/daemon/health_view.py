"""The daemon's side of the per-GPU health state: gather each GPU's facts from the store, assess, hand the result
to the store (``Store.ingest``, kept in ``Store.health``) for ``/metrics``, ``/api/v1/status`` and
``gpuwatchd status`` (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuwatchd.gpu.health import GpuFacts, assess, health_actions
from gpuwatchd.model import Alert, HealthChange
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.model.probes import FAILED
from gpuwatchd.store import Store


def gpu_facts(store: Store) -> dict[str, GpuFacts]:
    snap = store.latest
    sampled = {g.uuid for g in snap.gpus} if snap is not None and not store.stale else set()
    failed: dict[str, str] = {}
    for (uuid, probe), rec in sorted(store.probes.last.items()):
        if rec.result in FAILED and uuid not in failed:
            failed[uuid] = f"{probe} {rec.result}" + (f": {rec.problem}" if rec.problem else "")
    return {
        uuid: GpuFacts(pres.state, uuid in sampled, uuid in store.gpu_docks, failed.get(uuid),
                       store.gpu_docks[uuid].unique_id if uuid in store.gpu_docks else None)
        for uuid, pres in store.presence.items()
        if pres.identity.parent_uuid is None  # MIG devices: their GPU's health is theirs
    }


def update_health(store: Store, alerts: Iterable[Alert], now: float) -> dict[str, GpuHealth]:
    snap = store.latest
    nvml_ok = snap is not None and snap.nvml_ok and not store.stale
    health = assess(gpu_facts(store), alerts, now, store.health, nvml_ok=nvml_ok, xid_actions=health_actions())
    store.ingest(HealthChange(health))
    return store.health
