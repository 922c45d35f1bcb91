"""The ``/api/v1/status`` JSON snapshot of the store (no I/O; JSON-ready types only)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.gpu.clock_events import decode
from gpuwatchd.model import GpuSample, ProcessOwner, ProcessSample
from gpuwatchd.model.health import ACTION_TEXT
from gpuwatchd.store import Store

STATUS_VERSION = 1  # bump when a key changes meaning; adding keys does not bump it

# Fields of GpuSample shown under "identity" or in their own keys rather than under "readings".
_NOT_READINGS = frozenset({"uuid", "index", "name", "pci_bus_id", "serial", "processes", "errors"})


def _process(p: ProcessSample, owner: ProcessOwner | None) -> dict[str, Any]:
    out = dataclasses.asdict(p)
    # Who holds it (sources/attribution): only the known fields; null for a host process or an unknown one.
    out["owner"] = {k: v for k, v in dataclasses.asdict(owner).items() if v is not None} if owner else None
    return out


def _readings(g: GpuSample) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(g):
        if f.name in _NOT_READINGS:
            continue
        value = getattr(g, f.name)
        if value is None or value == {}:
            continue  # no reading: leave it out rather than show a null that reads like a value
        out[f.name] = list(value) if isinstance(value, tuple) else value
    if g.clocks_event_reasons is not None:
        out["clocks_event_reasons_active"] = decode(g.clocks_event_reasons)
    return out


def _probe_verdict(store: Store, uuid: str) -> dict[str, Any] | None:
    """The last torch health probe verdict of a GPU (docs/probes.md), None before its first run."""
    v = store.probes.verdicts.get(uuid)
    return dataclasses.asdict(v) if v is not None else None


def _health(store: Store, uuid: str) -> dict[str, Any]:
    """``{state, reason, action, action_text, since, evidence}`` (gpuwatchd/gpu/health.py); unknown before the
    first rule evaluation."""
    h = store.health.get(uuid)
    if h is None:
        return {"state": "unknown", "reason": "not assessed yet (no rule evaluation since the GPU appeared)",
                "action": "none", "action_text": ACTION_TEXT["none"], "since": None, "evidence": []}
    return h.as_dict()


def _xid_entry(code: int) -> dict[str, object] | None:
    e = xid_catalog.entry(code)
    return xid_catalog.as_dict(e) if e is not None else None


def _xid_catalog() -> dict[str, object]:
    c = xid_catalog.catalog()
    return {"source": c.source, "version": c.version, "via": c.via, "codes": len(c.entries)}


def status_from_store(store: Store) -> dict[str, Any]:
    """NVML status, GPUs (presence, identity, readings, processes), links, sources and Xid counts."""
    snap = store.latest
    samples = {g.uuid: g for g in snap.gpus} if snap is not None else {}
    gpus = []
    for uuid, pres in sorted(store.presence.items(), key=lambda kv: (kv[1].identity.index, kv[0])):
        ident = pres.identity
        sample = samples.get(uuid) if pres.state == "present" else None
        gpus.append(
            {
                "uuid": uuid,
                "index": ident.index,
                "name": ident.name,
                "pci_bus_id": ident.pci_bus_id,
                "state": pres.state,
                "since": pres.since,
                "last_seen": pres.last_seen,
                "readings": _readings(sample) if sample is not None else None,
                "processes": [_process(p, store.process_owner(uuid, p.pid)) for p in sample.processes]
                if sample is not None else [],
                "processes_total": sample.processes_total if sample is not None else None,
                "errors": dict(sample.errors) if sample is not None else {},
                "probe": _probe_verdict(store, uuid),
                "health": _health(store, uuid),
            }
        )
    return {
        "version": STATUS_VERSION,
        "nvml": {
            "ok": snap.nvml_ok if snap is not None else None,
            "error": snap.nvml_error if snap is not None else None,
            "stale": store.stale,
            "driver_version": snap.driver_version if snap is not None else None,
            "nvml_version": snap.nvml_version if snap is not None else None,
            "cuda_driver_version": snap.cuda_driver_version if snap is not None else None,
            "device_count": snap.device_count if snap is not None else None,
            "last_poll_timestamp": snap.timestamp if snap is not None else None,
            "poll_duration_seconds": snap.poll_duration_seconds if snap is not None else None,
            "worker_restarts": store.nvml_worker_restarts,
            "init_failures": store.nvml_init_failures,
            "lost": [dataclasses.asdict(x) for x in snap.lost] if snap is not None else [],
        },
        "gpus": gpus,
        "links": [dataclasses.asdict(link) for _, link in sorted(store.links.items())],
        "sources": {name: dataclasses.asdict(s) for name, s in sorted(store.sources.items())},
        # Each code with NVIDIA's catalog entry (mnemonic, description, immediate and investigatory action, and
        # gpuwatchd's severity; null for a code the catalog does not know).
        "xid_counts": [
            {"uuid": uuid, "xid": xid, "count": count, "catalog": _xid_entry(xid)}
            for (uuid, xid), count in sorted(store.xid_counts.items())
        ],
        "xid_catalog": _xid_catalog(),
        "recent_xids": [dataclasses.asdict(ev) for ev in store.recent_xids],
        "pods": [dataclasses.asdict(p) for p in store.attribution.pods] if store.attribution is not None else [],
        "config": {
            "last_reload_successful": store.config_reload_success,
            "last_reload_success_timestamp": store.config_reload_timestamp,
        },
    }


def scenario_clock(name: str, start: float | None, now: float, speed: float) -> dict[str, Any]:
    """``scenario`` in ``/api/v1/status`` under ``gpuwatchd sim``: the scenario's start on the daemon's clock and
    its time now, so a test can align what the daemon reports with the scenario's (or a replayed log's) seconds.
    ``start`` is None (and ``time`` 0) until the scenario clock starts, at the daemon's first snapshot."""
    return {"name": name, "start": start, "time": 0.0 if start is None else max(0.0, now - start), "speed": speed}
