"""The pure decisions: which GPUs drain the node, the drain's reason, and the next step."""

from __future__ import annotations

from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.config import DEFAULT_DRAIN_ACTIONS, MAX_REASON_CHARS
from gpuwatchd.remediation.ledger import Drain
from gpuwatchd.remediation.policy import drain_reason, next_step, out_of_service

U0, U1 = "GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-0000-4000-8000-000000000001"


def h(state: str, action: str = "none", reason: str = "r", evidence: tuple[str, ...] = ()) -> GpuHealth:
    return GpuHealth(state, reason, action, 0.0, evidence)  # type: ignore[arg-type]


def test_only_unhealthy_gpus_whose_action_takes_them_out_of_service() -> None:
    health = {
        U0: h("unhealthy", "reboot", evidence=("GpuLost",)),
        U1: h("unhealthy", "restart_app", evidence=("GpuXidError",)),  # the job's problem: the node stays open
        "GPU-2": h("degraded", "reset_gpu"),  # degraded: still usable
        "GPU-3": h("unhealthy", "check_cable"),
        "GPU-4": h("unknown"),
    }
    assert list(out_of_service(health, DEFAULT_DRAIN_ACTIONS)) == [U0]
    assert list(out_of_service(health, ("restart_app",))) == [U1]


def test_the_reason_names_the_gpu_the_evidence_and_gpuwatchd_on_one_bounded_line() -> None:
    bad = {U0: h("unhealthy", "reset_gpu", "Xid 48 [DBE]\non GPU 0" + "x" * 400, ("GpuEccError", "GpuXidError")),
           U1: h("unhealthy", "reboot", "lost", ("GpuLost",))}
    reason = drain_reason(bad, {U0: "GPU 0", U1: "GPU 1"})
    assert reason.startswith(f"gpuwatchd: GPU 0 ({U0}) unhealthy, reset_gpu: Xid 48 (DBE) on GPU 0")
    assert reason.endswith("; evidence GpuEccError,GpuXidError; +1 more GPU")
    assert len(reason) <= MAX_REASON_CHARS and "\n" not in reason and "[" not in reason


def test_next_step() -> None:
    bad = {U0: h("unhealthy", "reboot")}
    healthy = {U0: h("healthy")}
    held = Drain("n1", "gpuwatchd: x", 100.0, (U0,))
    kw = {"resume_after": 60.0, "min_interval": 30.0}
    assert next_step(bad, bad, None, None, None, now=100.0, **kw) == "drain"
    assert next_step(bad, bad, None, None, 90.0, now=100.0, **kw) == "rate_limited"
    assert next_step(bad, bad, None, None, 60.0, now=100.0, **kw) == "drain"
    assert next_step(bad, bad, held, None, 100.0, now=500.0, **kw) == "none"  # held: never drained twice
    assert next_step({}, healthy, held, 450.0, 100.0, now=500.0, **kw) == "wait_resume"  # healthy for 50 s < 60 s
    assert next_step({}, healthy, held, 440.0, 100.0, now=500.0, **kw) == "resume"
    assert next_step({}, healthy, held, 440.0, 480.0, now=500.0, **kw) == "rate_limited"
    # A GPU the drain named that is unknown (removed, not answering) is not recovered.
    assert next_step({}, {U0: h("unknown")}, held, 0.0, 0.0, now=500.0, **kw) == "wait_resume"
    assert next_step({}, {}, held, 0.0, 0.0, now=500.0, **kw) == "wait_resume"
    assert next_step({}, healthy, None, 0.0, 0.0, now=500.0, **kw) == "none"
