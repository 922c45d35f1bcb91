"""The per-GPU health state from its evidence (gpuwatchd/gpu/health.py): worst evidence wins, the most invasive
action among it, eGPU links say "check the cable", and the state recovers when the evidence clears."""

from __future__ import annotations

from gpuwatchd.gpu.health import GpuFacts, assess, with_parent, xid_action
from gpuwatchd.model import Alert, AlertState, Severity
from gpuwatchd.model.health import GpuHealth

U = "GPU-aaaa"


def _alert(name: str, severity: Severity, state: AlertState = "firing", **labels: str) -> Alert:
    return Alert(name, severity, {"alertname": name, "severity": severity, "uuid": U, **labels},
                 f"{name} summary", "", state, 0.0)


def _one(alerts: list[Alert], facts: GpuFacts | None = None, *, nvml_ok: bool = True,
         prev: dict[str, GpuHealth] | None = None, now: float = 100.0) -> GpuHealth:
    f = facts or GpuFacts("present", True, False)
    return assess({U: f}, alerts, now, prev or {}, nvml_ok=nvml_ok, xid_actions={13: "restart_app", 79: "reboot",
                                                                                  48: "reset_gpu"})[U]


def test_healthy_without_evidence_and_jobs_alerts_are_not_evidence() -> None:
    h = _one([_alert("GpuMemoryLeak", "warning"), _alert("GpuUnderutilized", "info")])
    assert (h.state, h.action, h.evidence) == ("healthy", "none", ())


def test_pending_and_resolved_alerts_are_not_evidence() -> None:
    assert _one([_alert("GpuLost", "critical", "pending"), _alert("GpuProbeFailed", "critical", "resolved")]
                ).state == "healthy"


def test_worst_state_wins_with_the_most_invasive_action() -> None:
    h = _one([_alert("GpuThrottled", "warning"), _alert("GpuXidError", "warning", xid="13"),
              _alert("GpuXidError", "critical", xid="79"), _alert("GpuEccError", "critical")])
    assert (h.state, h.action) == ("unhealthy", "reboot")
    assert "GpuXidError summary" in h.reason and "GpuEccError" in h.reason and "GpuThrottled" in h.reason
    assert h.evidence == ("GpuEccError", "GpuThrottled", "GpuXidError")


def test_application_xid_degrades_and_says_restart_the_app() -> None:
    h = _one([_alert("GpuXidError", "warning", xid="13")])
    assert (h.state, h.action) == ("degraded", "restart_app")


def test_unknown_xid_code_is_a_conservative_reset() -> None:
    assert _one([_alert("GpuXidError", "critical", xid="999")]).action == "reset_gpu"


def test_egpu_link_problems_say_check_the_cable() -> None:
    egpu = GpuFacts("present", True, True)
    assert _one([_alert("GpuLost", "critical")], egpu).action == "check_cable"
    assert _one([_alert("GpuXidError", "critical", xid="79")], egpu).action == "check_cable"
    assert _one([_alert("GpuPcieLinkDegraded", "warning")], egpu).action == "check_cable"
    assert _one([_alert("GpuLost", "critical")]).action == "reboot"


def test_recovery_action_label_chooses_reboot_or_reset() -> None:
    assert _one([_alert("GpuRecoveryActionRequired", "critical", action="node_reboot")]).action == "reboot"
    assert _one([_alert("GpuRecoveryActionRequired", "critical", action="gpu_reset")]).action == "reset_gpu"


def test_probe_failure_without_its_alert_is_still_evidence() -> None:
    h = _one([], GpuFacts("present", True, False, probe_failed="gemm fail: 3 mismatches"))
    assert (h.state, h.action, h.evidence) == ("unhealthy", "reset_gpu", ("probe",))
    assert "gemm fail" in h.reason


def test_unknown_when_the_gpu_cannot_be_seen() -> None:
    assert _one([], nvml_ok=False).state == "unknown"
    assert _one([], GpuFacts("lost", False, False)).state == "unknown"
    removed = _one([], GpuFacts("removed", False, True))
    assert (removed.state, removed.action) == ("unknown", "check_cable")
    assert _one([], GpuFacts("present", False, False)).state == "unknown"


def test_recovers_when_evidence_clears_and_since_tracks_the_state() -> None:
    bad = _one([_alert("GpuProbeFailed", "critical")], now=10.0)
    still = _one([_alert("GpuProbeFailed", "critical")], prev={U: bad}, now=20.0)
    assert still.since == 10.0
    good = _one([], prev={U: still}, now=30.0)
    assert (good.state, good.since) == ("healthy", 30.0)


def test_catalog_buckets_map_to_actions() -> None:
    assert xid_action("RESTART_APP") == "restart_app"
    assert xid_action("RESTART_BM") == "reboot"
    assert xid_action("RESET_GPU") == "reset_gpu"
    assert xid_action("WORKFLOW_XID_48") == "reset_gpu"
    assert xid_action("CHECK_MECHANICALS") == "inspect_hardware"
    assert xid_action("IGNORE") == "none"
    assert xid_action("") == "reset_gpu"
    assert xid_action("SOMETHING_NEW") == "reset_gpu"


def test_a_docks_alert_is_evidence_for_the_gpus_behind_it() -> None:
    link = Alert("GpuDockLinkDegraded", "warning", {"alertname": "GpuDockLinkDegraded", "severity": "warning",
                                                    "unique_id": "dock-1", "dock": "Razer Core X"},
                 "Thunderbolt dock Razer Core X link trained at 1 x 20 Gb/s", "", "firing", 0.0)
    facts = {U: GpuFacts("present", True, True, dock_id="dock-1"),
             "GPU-other": GpuFacts("present", True, False)}
    out = assess(facts, [link], 1.0, {}, nvml_ok=True, xid_actions={})
    assert (out[U].state, out[U].action, out[U].evidence) == ("degraded", "check_cable", ("GpuDockLinkDegraded",))
    assert out["GPU-other"].state == "healthy"


def test_healthy_says_what_it_covers() -> None:
    h = _one([_alert("GpuMemoryLeak", "warning")])
    assert "the GPU itself" in h.reason and "GpuMemoryLeak" in h.reason and "not counted" in h.reason


def test_a_mig_device_takes_its_gpus_state_when_worse_and_keeps_its_own_otherwise() -> None:
    own_degraded = GpuHealth("degraded", "held by a dead process", "reset_gpu", 50.0, ("GpuMemoryHeldByDeadProcess",))
    healthy = GpuHealth("healthy", "fine", "none", 10.0)
    gpu_bad = GpuHealth("unhealthy", "Xid 48 (DBE)", "reset_gpu", 90.0, ("GpuXidError",))
    h = with_parent(healthy, gpu_bad, U, healthy, 100.0)
    assert (h.state, h.action, h.since, h.evidence) == ("unhealthy", "reset_gpu", 100.0, ("GpuXidError",))
    assert h.reason == f"the GPU it is part of ({U}) is unhealthy: Xid 48 (DBE)"
    assert with_parent(healthy, gpu_bad, U, h, 120.0).since == 100.0  # still in that state: since holds
    merged = with_parent(own_degraded, gpu_bad, U, None, 100.0)
    assert merged.evidence == ("GpuMemoryHeldByDeadProcess", "GpuXidError")
    # Not worse than its own: its own (a healthy GPU, or one with no verdict yet, leaves the slice's own one).
    assert with_parent(own_degraded, healthy, U, None, 100.0) is own_degraded
    assert with_parent(own_degraded, None, U, None, 100.0) is own_degraded
