"""One health state per GPU, the way gpud and DCGM present it: healthy, degraded, unhealthy or unknown, with the
reason and the one thing to do (no I/O).

Derived at every rule evaluation from the evidence the daemon already holds: the firing alerts on the GPU (the Xid
history enters through ``GpuXidError`` and the repetition rules, which read it), the torch probes' last verdicts,
and whether NVML can see the GPU at all. Nothing is sticky: when the alerts resolve and a probe passes again, the
state is healthy again at the next evaluation (a device marked unhealthy forever is a known complaint about other
tools, NVIDIA/k8s-device-plugin#1014). ``/readyz`` does not look at it.

The worst evidence wins: unhealthy > degraded > healthy; among evidence of one state, the most invasive action
wins (reboot > reseat/inspect > reset > check the cable > restart the app), because doing it also covers the
lesser ones. ``unknown`` is for a GPU the daemon cannot see now (NVML down or its data stale, the GPU not
answering yet, or removed) and no alert says more.

A MIG device is assessed on its own evidence (alerts under its ``MIG-...`` uuid) and then takes its GPU's state
when that is worse (``with_parent``): a fault of the GPU is a fault of every slice of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from gpuwatchd.gpu import xid_catalog
from gpuwatchd.model import Alert
from gpuwatchd.model.health import ACTION_TEXT, ACTIONS, ADVICE, GpuHealth, HealthAction, HealthState

# The alerts that speak for everything else about a GPU while they fire (rules/advice.py INCIDENT_ALERTS).
INCIDENT_ALERTS = ("GpuLost", "GpuRemoved")

# What "healthy" covers, said with it: the GPU itself, not the jobs on it (a leak is an alert, not a GPU fault).
HEALTHY_REASON = ("no fault on the GPU itself (its hardware, link, dock, driver, Xids, probes); alerts about the jobs "
                  "on it, such as GpuMemoryLeak, are not counted")

_STATE_RANK = {"healthy": 0, "unknown": 1, "degraded": 2, "unhealthy": 3}
_ACTION_RANK = {a: i for i, a in enumerate(ACTIONS)}

# Alerts that say something about the GPU itself -> (state when critical, state when warning, action, action on
# an eGPU). Alerts about a job (GpuMemoryLeak, GpuUnderutilized) or the daemon (GpuwatchdRuleFailing) are not
# evidence about the GPU's health and are left out. GpuXidError's action comes from the Xid catalog.
_ALERT_EVIDENCE: dict[str, tuple[HealthState, HealthState, HealthAction, HealthAction]] = {
    "GpuLost": ("unhealthy", "unhealthy", "reboot", "check_cable"),
    "GpuRemoved": ("unhealthy", "unhealthy", "inspect_hardware", "check_cable"),
    "GpuEccError": ("unhealthy", "degraded", "reset_gpu", "reset_gpu"),
    "GpuProbeFailed": ("unhealthy", "unhealthy", "reset_gpu", "reset_gpu"),
    "GpuPerformanceDegraded": ("degraded", "degraded", "inspect_hardware", "check_cable"),
    "GpuPcieLinkDegraded": ("degraded", "degraded", "inspect_hardware", "check_cable"),
    "GpuPcieReplays": ("degraded", "degraded", "inspect_hardware", "check_cable"),
    "GpuTemperatureHigh": ("unhealthy", "degraded", "inspect_hardware", "inspect_hardware"),
    "GpuThrottled": ("degraded", "degraded", "inspect_hardware", "inspect_hardware"),
    "GpuNvlinkErrors": ("unhealthy", "degraded", "reset_gpu", "reset_gpu"),
    "GpuRecoveryActionRequired": ("unhealthy", "degraded", "reset_gpu", "reset_gpu"),
    "GpuFabricNotReady": ("unhealthy", "unhealthy", "reboot", "reboot"),
    "GpuMemoryHeldByDeadProcess": ("degraded", "degraded", "reset_gpu", "reset_gpu"),
    "GpuXidRepeated": ("unhealthy", "degraded", "inspect_hardware", "inspect_hardware"),
    "GpuXidSupportCase": ("unhealthy", "unhealthy", "inspect_hardware", "inspect_hardware"),
    # About the Thunderbolt dock a GPU sits behind (label unique_id, no uuid): evidence for the GPUs behind it.
    "GpuDockLinkDegraded": ("degraded", "degraded", "check_cable", "check_cable"),
    "GpuDockUnauthorized": ("degraded", "degraded", "check_cable", "check_cable"),
}
# GpuRecoveryActionRequired's ``action`` label -> what to do.
_RECOVERY: dict[str, HealthAction] = {
    "node_reboot": "reboot", "system_reboot": "reboot", "gpu_reset": "reset_gpu", "drain_and_reset": "reset_gpu",
    "bus_reset": "reset_gpu", "drain_p2p": "restart_app", "recover_imex_domain": "restart_app",
}


@dataclass(frozen=True, slots=True)
class _Evidence:
    state: HealthState
    action: HealthAction
    reason: str
    source: str
    advice: str = ""  # the alert's own advice (its ``action`` annotation, rules/advice.py)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the daemon knows about one GPU apart from its alerts."""

    presence: str  # present | lost | removed
    has_sample: bool  # a reading of it is in the latest snapshot
    egpu: bool  # behind a Thunderbolt dock
    probe_failed: str | None = None  # the problem of a probe whose last run failed (wrong numbers, hang, crash)
    dock_id: str | None = None  # unique_id of the Thunderbolt dock it is (or was last) behind


def xid_action(immediate: str) -> HealthAction:
    """The health action for an Xid catalog immediate-action bucket (RESTART_APP, RESET_GPU, RESTART_BM ...)."""
    b = immediate.upper()
    if b in ("RESTART_BM", "RESTART_VM"):
        return "reboot"
    if b == "CHECK_MECHANICALS":
        return "inspect_hardware"
    if b.startswith(("RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK", "XID_154", "CHECK_UVM")):
        return "reset_gpu"
    if b in ("RESTART_APP", "WORKFLOW_XID_45"):
        return "restart_app"
    if b == "IGNORE":
        return "none"
    return "reset_gpu"  # CONTACT_SUPPORT, UPDATE_SWFW, blank, new buckets: the conservative recovery


@cache
def health_actions() -> Mapping[int, HealthAction]:
    """Per catalog code (gpuwatchd/gpu/xid_catalog.json), what the GPU's health state suggests from NVIDIA's
    immediate action; codes outside the catalog reset the GPU (the conservative default above). Built once (the
    catalog is packaged): the daemon asks at every evaluation, where building it cost a quarter as much as the
    rules themselves (8x32, docs/performance.md)."""
    out: dict[int, HealthAction] = {}
    for code, e in xid_catalog.catalog().entries.items():
        action = xid_action(e.immediate_action)
        out[code] = "restart_app" if action == "none" and e.severity != "info" else action
    return MappingProxyType(out)


def _from_alert(a: Alert, egpu: bool, xid_actions: Mapping[int, HealthAction]) -> _Evidence | None:
    if a.state != "firing" or a.severity == "info":
        return None
    if a.name == "GpuXidError":
        try:
            code = int(a.labels.get("xid", ""))
        except ValueError:
            code = -1
        action = xid_actions.get(code, "reset_gpu")
        if code == 79 and egpu:
            action = "check_cable"
        state: HealthState = "unhealthy" if a.severity == "critical" else "degraded"
        return _Evidence(state, action, a.summary, a.name, a.annotations.get(ADVICE, ""))
    spec = _ALERT_EVIDENCE.get(a.name)
    if spec is None:
        return None
    crit, warn, action, egpu_action = spec
    state = crit if a.severity == "critical" else warn
    if a.name == "GpuRecoveryActionRequired":
        action = _RECOVERY.get(a.labels.get("action", ""), action)
    return _Evidence(state, egpu_action if egpu else action, a.summary, a.name, a.annotations.get(ADVICE, ""))


def assess(
    facts: Mapping[str, GpuFacts],
    alerts: Iterable[Alert],
    now: float,
    previous: Mapping[str, GpuHealth],
    *,
    nvml_ok: bool,
    xid_actions: Mapping[int, HealthAction],
) -> dict[str, GpuHealth]:
    """The health of every GPU in ``facts`` (the GPUs the daemon has seen), from its evidence now."""
    by_gpu: dict[str, list[_Evidence]] = {u: [] for u in facts}
    alerts = list(alerts)
    # A lost or removed GPU: the loss speaks for it (what else fires about it follows from it, and is inhibited in
    # chat), so the page and `status` give the same advice as the one message chat got.
    gone = {a.labels.get("uuid", "") for a in alerts if a.state == "firing" and a.name in INCIDENT_ALERTS}
    for a in alerts:
        uuid = a.labels.get("uuid", "")
        if uuid in facts:
            targets = [uuid]
        elif "unique_id" in a.labels:  # a dock's alert: the GPUs behind that dock
            targets = [u for u, f in facts.items() if f.dock_id is not None and f.dock_id == a.labels["unique_id"]]
        else:
            continue
        for target in targets:
            if target in gone and a.name not in INCIDENT_ALERTS:
                continue
            ev = _from_alert(a, facts[target].egpu, xid_actions)
            if ev is not None:
                by_gpu[target].append(ev)
    out: dict[str, GpuHealth] = {}
    for uuid, f in facts.items():
        evidence = by_gpu[uuid]
        if f.probe_failed is not None and not any(e.source == "GpuProbeFailed" for e in evidence):
            # GpuProbeFailed turned off in the config: the probe's own verdict is still evidence.
            evidence.append(_Evidence("unhealthy", "reset_gpu", f"torch probe failed: {f.probe_failed}", "probe"))
        health = _judge(f, evidence, nvml_ok=nvml_ok)
        prev = previous.get(uuid)
        since = prev.since if prev is not None and prev.state == health[0] else now
        out[uuid] = GpuHealth(health[0], health[1], health[2], since, tuple(sorted({e.source for e in evidence})),
                              health[3])
    return out


def _judge(f: GpuFacts, evidence: list[_Evidence], *, nvml_ok: bool) -> tuple[HealthState, str, HealthAction, str]:
    """(state, reason, action, advice): the advice is the chosen evidence's alert's, else the action's words."""
    state, reason, action, text = _verdict(f, evidence, nvml_ok=nvml_ok)
    return state, reason, action, text or ACTION_TEXT[action]


def _verdict(f: GpuFacts, evidence: list[_Evidence], *, nvml_ok: bool) -> tuple[HealthState, str, HealthAction, str]:
    if evidence:
        worst = max(_STATE_RANK[e.state] for e in evidence)
        top = [e for e in evidence if _STATE_RANK[e.state] == worst]
        top.sort(key=lambda e: -_ACTION_RANK[e.action])
        first = top[0]
        others = sorted({e.source for e in evidence if e is not first})
        reason = first.reason + (f" (also: {', '.join(others)})" if others else "")
        return first.state, reason, first.action, first.advice
    if not nvml_ok:
        return "unknown", "NVML cannot be read now: the GPU's health is not known", "none", ""
    if f.presence == "removed":
        return ("unknown", "the GPU is gone from enumeration (removed or unplugged)",
                "check_cable" if f.egpu else "none", "")
    if f.presence == "lost":
        return "unknown", "the GPU does not answer (lost); waiting for the GpuLost evidence", "none", ""
    if not f.has_sample:
        return "unknown", "no reading of the GPU yet, or its readings are stale", "none", ""
    return "healthy", HEALTHY_REASON, "none", ""


def with_parent(own: GpuHealth, parent: GpuHealth | None, parent_uuid: str, previous: GpuHealth | None,
                now: float) -> GpuHealth:
    """A MIG device's health: its own (``assess`` on the alerts under its uuid), or its GPU's when that is worse,
    said as the GPU's ("the GPU it is part of (GPU-...) is unhealthy: <reason>") with the GPU's action and advice.
    ``since`` is when the MIG device entered the state it has now (``previous`` is its last health)."""
    if parent is None or _STATE_RANK[parent.state] <= _STATE_RANK[own.state]:
        return own
    since = previous.since if previous is not None and previous.state == parent.state else now
    reason = f"the GPU it is part of ({parent_uuid}) is {parent.state}: {parent.reason}"
    return GpuHealth(parent.state, reason, parent.action, since, tuple(sorted({*own.evidence, *parent.evidence})),
                     parent.advice)
