"""``gpuwatchd status``: fetch a running daemon's status and alerts over HTTP and print them as tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuwatchd.rules import advice
from gpuwatchd.runtime.terminal import safe_tree

GIB = 1024**3


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _num(v: Any, fmt: str, scale: float = 1.0) -> str:
    return fmt.format(v * scale) if isinstance(v, int | float) and not isinstance(v, bool) else "-"


def _mem(used: Any, total: Any) -> str:
    if isinstance(used, int | float) and isinstance(total, int | float) and total:
        return f"{used / GIB:.1f}/{total / GIB:.1f} GiB"
    return _num(used, "{:.1f} GiB", 1 / GIB)


def _pick(d: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def owner_text(owner: object) -> str:
    """A process' owner from /api/v1/status, short: "pod ns/name/container", "container 3f2a9c1b7d4e (web)",
    "job 4242", or "-" for a host process."""
    if not isinstance(owner, dict):
        return "-"
    parts = []
    if owner.get("pod"):
        pod = f"pod {owner.get('namespace')}/{owner['pod']}"
        parts.append(pod + (f"/{owner['container']}" if owner.get("container") else ""))
    elif owner.get("container_id"):
        extra = ", ".join(str(owner[k]) for k in ("name", "image") if owner.get(k))
        parts.append(f"container {owner['container_id']}" + (f" ({extra})" if extra else ""))
    if owner.get("hpc_job"):
        parts.append(f"job {owner['hpc_job']}")
    return " ".join(parts) or "-"


def gpu_index(g: Mapping[str, Any]) -> str:
    """A GPU's index as the views show it: ``0``, or ``was 0`` for a GPU that is gone (lost or removed). NVML gives
    the index to the next GPU when one goes (an eGPU pulled: the internal GPU becomes 0), so a gone GPU's last index
    is history, and two rows saying ``0`` would be a lie about one of them."""
    index = g.get("index")
    text = str(index) if index is not None else "-"
    state = g.get("state")
    return text if state in (None, "present") else f"was {text}"


def gpu_name(g: Mapping[str, Any]) -> str:
    """``GPU 0``, or ``was GPU 0`` for a GPU that is gone (as the status page says it); a MIG device, which has its
    GPU's index, with its name as the alerts say it: ``GPU 0 (NVIDIA A100-SXM4-80GB MIG 1g.10gb)``."""
    index = g.get("index")
    text = "GPU " + (str(index) if index is not None else "?")
    if g.get("state") not in (None, "present"):
        text = "was " + text
    return f"{text} ({g.get('name') or '?'})" if str(g.get("uuid", "")).startswith("MIG-") else text


def uncounted_alerts(g: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the alerts firing on this GPU (or MIG device) that its health does not count: those about a job
    on it (GpuMemoryLeak, GpuUnderutilized) and info ones (gpuwatchd/gpu/health.py). Said beside a "healthy" so it
    is not read as "nothing is wrong here"."""
    health = g.get("health")
    evidence = health.get("evidence") if isinstance(health, dict) else None
    counted = {str(e) for e in evidence} if isinstance(evidence, list) else set()
    names = set()
    for a in alerts:
        labels = a.get("labels")
        if not isinstance(labels, dict) or a.get("state") != "firing" or labels.get("uuid") != g.get("uuid"):
            continue
        name = str(labels.get("alertname") or "?")
        if name not in counted:
            names.add(name)
    return sorted(names)


def render_status(status: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]]) -> str:
    """Three tables: GPUs, their processes, and the alerts, preceded by one line about NVML and the daemon.

    Every string from the daemon is made terminal-safe first (``terminal.safe_tree``): a process name holding
    ``ESC [2J`` or a CR is printed with ``?`` in their place."""
    status, alerts = safe_tree(status), safe_tree(alerts)
    out = [_header(status)]
    gpus = [g for g in status.get("gpus", []) if isinstance(g, dict)]
    rows = []
    procs = []
    notes: list[str] = []  # one line per GPU that is not healthy: the reason and what to do
    more_lines: list[str] = []
    for entry in gpus:
        # Readings sit under "readings" (absent for a lost or removed GPU); identity and state at the top.
        g = {**(entry.get("readings") or {}), **entry}
        rows.append(
            [
                gpu_index(g),
                str(_pick(g, "name") or "-"),
                str(_pick(g, "state") or ("present" if g.get("present", True) else "gone")),
                _mem(_pick(g, "memory_used_bytes"), _pick(g, "memory_total_bytes")),
                _num(_pick(g, "utilization_gpu_ratio", "utilization_ratio"), "{:.0f}%", 100),
                _num(_pick(g, "temperature_celsius"), "{:.0f}C"),
                _num(_pick(g, "power_watts"), "{:.0f}W"),
                _probe(g.get("probe")),
                _health_state(g.get("health")),
                str(g.get("uuid", "-")),
            ]
        )
        health = g.get("health")
        if isinstance(health, dict) and health.get("state") not in (None, "healthy"):
            notes.append(f"{gpu_name(g)} {health.get('state')}: {health.get('reason') or '-'}")
            todo = advice_text(health)
            if todo:
                notes.append(f"  What to do: {todo}")
        others = uncounted_alerts(g, alerts)
        if others:
            notes.append(f"{gpu_name(g)}: also firing, not counted in the GPU's health (about a job on it, or "
                         f"informational): {', '.join(others)}")
        for p in g.get("processes", []) or []:
            if isinstance(p, dict):
                procs.append(
                    [
                        rows[-1][0],
                        str(p.get("pid", "-")),
                        str(p.get("name") or "-"),
                        str(p.get("user") or "-"),
                        _num(_pick(p, "used_memory_bytes", "memory_used_bytes"), "{:.2f} GiB", 1 / GIB),
                        owner_text(p.get("owner")),
                    ]
                )
        more = more_processes(g)
        if more:
            more_lines.append(f"{gpu_name(g)}: {more}")
    headers = ["GPU", "NAME", "STATE", "MEMORY", "UTIL", "TEMP", "POWER", "PROBE", "HEALTH", "UUID"]
    out += ["", _table(headers, rows) if rows else "No GPUs."]
    if notes:
        out += ["", *notes]
    if procs:
        out += ["", _table(["GPU", "PID", "PROCESS", "USER", "GPU MEMORY", "OWNER"], procs), *more_lines]
    xids = _xid_rows(status, {str(g.get("uuid")): gpu_index(g) for g in gpus})
    if xids:
        out += ["", _table(["GPU", "XID", "COUNT", "SEVERITY", "MNEMONIC", "WHAT TO DO"], xids)]
    arows = []
    for a in alerts:
        labels = a.get("labels", {}) if isinstance(a.get("labels"), dict) else {}
        arows.append(
            [
                str(labels.get("alertname") or a.get("name") or "-"),
                str(labels.get("severity") or a.get("severity") or "-"),
                alert_state(a),
                str(labels.get("gpu") or labels.get("uuid") or "-"),
                str(_pick(a, "summary") or (a.get("annotations") or {}).get("summary") or ""),
            ]
        )
    out += ["", _table(["ALERT", "SEVERITY", "STATE", "GPU", "SUMMARY"], arows) if arows else "No alerts."]
    advices = alert_advice(alerts)
    if advices:
        out += ["", *advices]
    return "\n".join(out)


def alert_advice(alerts: Sequence[Mapping[str, Any]]) -> list[str]:
    """"What to do about GpuRemoved (GPU 0): ..." for each firing, unmuted alert that carries advice (its ``action``
    annotation, the text chat got: rules/advice.py)."""
    out = []
    for a in alerts:
        raw_ann, raw_labels = a.get("annotations"), a.get("labels")
        ann: Mapping[str, Any] = raw_ann if isinstance(raw_ann, dict) else {}
        labels: Mapping[str, Any] = raw_labels if isinstance(raw_labels, dict) else {}
        if alert_state(a) != "firing" or not ann.get("action"):
            continue
        where = labels.get("dock") or (f"GPU {labels['gpu']}" if labels.get("gpu") else None)
        out.append(f"What to do about {labels.get('alertname') or '?'}" + (f" ({where})" if where else "")
                   + f": {ann['action']}")
    return out


def advice_text(health: Mapping[str, Any]) -> str | None:
    """The advice the daemon rendered for a GPU (``health.action_text``, the text chat got: rules/advice.py), or
    None when there is nothing to do."""
    if health.get("action") in (None, "none"):
        return None
    return str(health.get("action_text") or health.get("action"))


def alert_state(a: Mapping[str, Any]) -> str:
    """``firing``, ``pending``, ``resolved``, or ``silenced``/``inhibited`` for a firing alert that is muted (the
    notification is held back; Alertmanager shows it as ``suppressed``)."""
    status = a.get("status") if isinstance(a.get("status"), dict) else {}
    state = str(a.get("state") or (status or {}).get("state") or "-")
    if state == "firing" and status:
        if status.get("silencedBy"):
            return "silenced"
        if status.get("inhibitedBy"):
            return "inhibited"
    return state


def more_processes(g: Mapping[str, Any]) -> str | None:
    """"N more processes (M in all)" when the daemon listed only the largest of a GPU's processes, else None."""
    listed = len([p for p in g.get("processes") or [] if isinstance(p, dict)])
    total = g.get("processes_total")
    if isinstance(total, int) and total > listed:
        return f"{total - listed} more processes ({total} in all; the {listed} using most memory are listed)"
    return None


def _probe(verdict: Any) -> str:
    """Last probe verdict of a GPU: "pass", "degraded", "FAILED", "skipped (busy_process)", or "-"."""
    return str(verdict.get("verdict") or "-") if isinstance(verdict, dict) else "-"


def _xid_rows(status: Mapping[str, Any], index: Mapping[str, str]) -> list[list[str]]:
    """One row per (GPU, Xid code) seen since the daemon started, with NVIDIA's catalog entry for the code and the
    daemon's advice for it (the text chat and the page show; never the catalog's raw bucket codes)."""
    rows = []
    for x in status.get("xid_counts") or []:
        if not isinstance(x, dict):
            continue
        raw = x.get("catalog")
        cat: dict[str, Any] = raw if isinstance(raw, dict) else {}
        todo = x.get("action")
        if not todo and isinstance(x.get("xid"), int):
            todo = advice.xid(x["xid"])  # a daemon from before the advice was in the status
        rows.append([index.get(str(x.get("uuid")), "?"), str(x.get("xid", "-")), str(x.get("count", "-")),
                     str(cat.get("severity") or "warning (not in the catalog)"), str(cat.get("mnemonic") or "-"),
                     str(todo or "-")])
    return rows


def _health_state(health: Any) -> str:
    """healthy, degraded, unhealthy or unknown (gpuwatchd/gpu/health.py); "-" from a daemon without it."""
    return str(health.get("state") or "-") if isinstance(health, dict) else "-"


def _header(status: Mapping[str, Any]) -> str:
    daemon = status.get("daemon", {}) if isinstance(status.get("daemon"), dict) else {}
    nvml = status.get("nvml", {}) if isinstance(status.get("nvml"), dict) else {}
    up = _pick(nvml, "up", "ok")
    if up is None:
        nvml_text = "NVML: unknown"
    elif up:
        nvml_text = f"NVML up, driver {nvml.get('driver_version') or '?'}"
    else:
        nvml_text = f"NVML down ({_pick(nvml, 'error', 'reason') or 'unknown reason'})"
    if status.get("stale") or nvml.get("stale"):
        nvml_text += ", data stale"
    host = daemon.get("host") or status.get("host") or "?"
    version = daemon.get("version") or status.get("version") or "?"
    restarts = daemon.get("nvml_worker_restarts", nvml.get("worker_restarts", 0))
    return f"gpuwatchd {version} on {host}: {nvml_text}; worker restarts {restarts}"
