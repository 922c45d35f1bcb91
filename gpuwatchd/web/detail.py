"""What the status page and ``status --watch`` need beyond the store's snapshot, added to ``/api/v1/status``.

Only keys are added (``STATUS_VERSION`` stays): per GPU its PCIe ``link`` (sysfs), its Thunderbolt ``dock``, a short
``memory_history``, and per process a ``memory_trend`` (its recent rate, and the leak rule's verdict
with its time to full while ``GpuMemoryLeak`` is pending or firing for it); at the top ``docks`` (with what an
unauthorized one needs), ``recent_xids[].meaning/action`` and ``xid_counts[].action`` (the Xid catalog's meaning and
the advice chat got for it, rules/advice.py), ``probe_results`` (each probe's last measures against baseline) and
``receivers`` (recent deliveries and failures per receiver). Reads memory only: it runs on the event loop for every
status request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuwatchd.gpu.bus_id import sysfs_bus_id
from gpuwatchd.model import Alert, DockSample
from gpuwatchd.rules import advice
from gpuwatchd.rules.xid import meaning, reattached_since, severity
from gpuwatchd.store import ProcessPoint, Store

if TYPE_CHECKING:
    from gpuwatchd.notify.dispatcher import Dispatcher

# GPU memory history on the page: the last half hour (a leak's ramp is visible; the store keeps an hour), at most
# this many points (the page polls it every few seconds: the JSON stays a few kB per GPU).
HISTORY_SECONDS = 1800.0
GPU_HISTORY_POINTS = 90
# The per-process rate shown next to its memory: least squares over the last five minutes (enough points at any
# poll interval; short enough to show a job's current behaviour, not its warm-up).
RATE_WINDOW_SECONDS = 300.0
LEAK_ALERT = "GpuMemoryLeak"


def _thin(points: Sequence[tuple[float, float]], most: int) -> list[list[float]]:
    """At most ``most`` points, evenly picked, the newest always kept; values rounded for the wire."""
    if len(points) > most:
        step = len(points) / most
        points = [points[int(i * step)] for i in range(most - 1)] + [points[-1]]
    return [[round(t, 1), round(v)] for t, v in points]


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope (value per second); None with fewer than three points or no time span."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / den


def _recent(points: Sequence[ProcessPoint], since: float) -> list[tuple[float, float]]:
    """The memory readings at or after ``since``, read from the newest back (the ring holds the retained hour)."""
    out = []
    for i in range(len(points) - 1, -1, -1):
        x = points[i]
        if x.t < since:
            break
        if x.used_memory_bytes is not None:
            out.append((x.t, float(x.used_memory_bytes)))
    out.reverse()
    return out


def _leaks(alerts: Iterable[Alert]) -> dict[tuple[str, str], Alert]:
    """(uuid, pid) -> the pending/firing GPU-memory leak alert of that process."""
    out: dict[tuple[str, str], Alert] = {}
    for a in alerts:
        if a.name == LEAK_ALERT and a.state in ("pending", "firing") and a.labels.get("kind", "gpu") == "gpu":
            out[(a.labels.get("uuid", ""), a.labels.get("pid", ""))] = a
    return out


def _leak_json(a: Alert) -> dict[str, Any]:
    eta = a.annotations.get("eta_seconds")
    rate = a.annotations.get("rate_bytes_per_second")
    return {
        "state": a.state,
        "active_at": a.active_at,
        "fired_at": a.fired_at,
        "eta_seconds": float(eta) if eta is not None else a.value,
        "rate_bytes_per_second": float(rate) if rate is not None else None,
        "summary": a.summary,
    }


def dock_json(store: Store, d: DockSample, alerts: Sequence[Alert] = ()) -> dict[str, Any]:
    """A Thunderbolt device with the GPUs behind it and, when it blocks them, what lets them in (the advice its
    GpuDockUnauthorized carries, rules/advice.py)."""
    out = dataclasses.asdict(d)
    out["gpu_bus_ids"] = list(d.gpu_bus_ids)
    out["gpus"] = store.dock_gpu_uuids(d)
    out["action"] = None
    if d.authorized is False:
        out["action"] = advice.for_dock(alerts, d.unique_id, d.security)
    return out


def xid_advice(store: Store, alerts: Sequence[Alert], uuid: str | None, code: int, last: float | None) -> str:
    """What to do about an Xid on the page and in ``status``: the advice chat got for it (rules/advice.py), with the
    evidence the Xid rule weighs (an eGPU, re-attached since ``last``)."""
    pres = store.presence.get(uuid) if uuid is not None else None
    return advice.for_xid(
        alerts, uuid, code, egpu=uuid is not None and uuid in store.gpu_docks,
        # as rules/xid.py: a reset-class Xid is over once the GPU was re-enumerated after it
        reattached=(uuid is not None and last is not None and severity(code) == "critical"
                    and reattached_since(store, uuid, last)),
        index=pres.identity.index if pres is not None else None)


def _probe_results(store: Store) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for (uuid, _), rec in sorted(store.probes.last.items()):
        row = dataclasses.asdict(rec)
        row.pop("uuid")
        row["measures"] = dict(rec.measures)
        row["ratios"] = dict(rec.ratios)
        row["degraded"] = dict(rec.degraded)
        out.setdefault(uuid, []).append(row)
    return out


def receivers_json(dispatcher: Dispatcher | None) -> list[dict[str, Any]]:
    """Per configured receiver: its type, queue, last error and recent deliveries (newest first)."""
    if dispatcher is None:
        return []
    return dispatcher.receivers_status()


def add_details(status: dict[str, Any], store: Store, alerts: Sequence[Alert], dispatcher: Dispatcher | None,
                now: float) -> dict[str, Any]:
    """``status`` (``status_from_store``'s dict) with the page's keys added in place; returns it."""
    leaks = _leaks(alerts)
    links = store.links
    for g in status.get("gpus", []):
        uuid = g["uuid"]
        link = links.get(sysfs_bus_id(g["pci_bus_id"])) if g.get("pci_bus_id") else None
        g["link"] = dataclasses.asdict(link) if link is not None else None
        dock = store.gpu_docks.get(uuid)
        g["dock"] = dock_json(store, dock, alerts) if dock is not None else None
        since = now - HISTORY_SECONDS
        hist = [(p.t, float(p.memory_used_bytes)) for p in store.gpu_history(uuid, since=since)
                if p.memory_used_bytes is not None]
        g["memory_history"] = _thin(hist, GPU_HISTORY_POINTS)
        for p in g.get("processes", []):
            pid = p.get("pid")
            recent = _recent(store.process_history(uuid, pid), now - RATE_WINDOW_SECONDS)
            leak = leaks.get((uuid, str(pid)))
            p["memory_trend"] = {
                "rate_bytes_per_second": _slope(recent),
                "leak": _leak_json(leak) if leak is not None else None,
            }
    last: dict[tuple[str | None, int], float] = {}
    for x in status.get("recent_xids", []):
        if isinstance(x.get("xid"), int):
            x["meaning"] = meaning(x["xid"])
            x["action"] = xid_advice(store, alerts, x.get("uuid"), x["xid"], x.get("timestamp"))
            last[(x.get("uuid"), x["xid"])] = max(last.get((x.get("uuid"), x["xid"]), 0.0), x.get("timestamp") or 0.0)
    for c in status.get("xid_counts", []):
        if isinstance(c.get("xid"), int):
            c["action"] = xid_advice(store, alerts, c.get("uuid"), c["xid"], last.get((c.get("uuid"), c["xid"])))
    status["docks"] = [dock_json(store, d, alerts) for d in store.docks]
    status["probe_results"] = _probe_results(store)
    status["receivers"] = receivers_json(dispatcher)
    return status

