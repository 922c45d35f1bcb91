"""Xid repetition: an application Xid once is the job's bug, the same code across jobs on one GPU is the GPU, and
fatal Xids coming back within a day are a support case (rules/xid_repeat.py)."""

from __future__ import annotations

from gpuwatchd.config.types import validate
from gpuwatchd.model import XidEvent
from gpuwatchd.rules.condition import Condition
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.xid_repeat import REPEATED, SUPPORT_CASE, conditions
from gpuwatchd.store import Store

from .conftest import T0, UUID, gpu, snap

OTHER = "GPU-5a3c1b2e-0000-4000-8000-000000000001"


def _store(*events: XidEvent, now: float) -> Store:
    s = Store(retention_seconds=3600)
    s.apply(snap(now, gpu(), gpu(uuid=OTHER, index=1), xid_events=tuple(events)))
    return s


def _ev(t: float, code: int, uuid: str = UUID, pid: int | None = None) -> XidEvent:
    msg = f"NVRM: Xid (PCI:0000:0c:00): {code}, pid={pid}, name=python" if pid is not None else None
    return XidEvent(uuid, code, T0 + t, "kmsg" if pid is not None else "nvml", None, msg)


def _names(conds: list[Condition]) -> list[tuple[str, str]]:
    return [(c.name, c.labels.get("uuid", "")) for c in conds]


def test_an_application_xid_once_or_in_one_job_is_not_escalated() -> None:
    now = T0 + 3600
    assert conditions(_store(_ev(0, 13), now=now), now, RulesConfig()) == []
    one_job = [_ev(t, 31, pid=4242) for t in (0, 600, 1200, 1800)]  # one long job, many faults: its bug
    assert conditions(_store(*one_job, now=now), now, RulesConfig()) == []


def test_the_same_code_across_jobs_on_one_gpu_points_at_the_gpu() -> None:
    now = T0 + 7200
    events = [_ev(0, 31, pid=100), _ev(1000, 31, pid=200), _ev(2000, 31, pid=300)]
    (c,) = conditions(_store(*events, now=now), now, RulesConfig())
    assert (c.name, c.severity, c.labels["xid"], c.value) == (REPEATED, "warning", "31", 3.0)
    assert "in 3 different jobs" in c.summary and "no other GPU of this host had it" in c.summary
    assert "dcgmi diag" in c.annotations["action"]


def test_without_pids_bursts_are_jobs() -> None:
    now = T0 + 7200
    burst = [_ev(t, 13) for t in (0, 1, 2, 3)]  # one job's burst: one job
    assert conditions(_store(*burst, now=now), now, RulesConfig()) == []
    three = [_ev(t, 13) for t in (0, 1, 600, 601, 1200)]  # three bursts more than burst_gap (3 min) apart
    assert _names(conditions(_store(*three, now=now), now, RulesConfig())) == [(REPEATED, UUID)]


def test_the_same_code_as_often_on_another_gpu_follows_the_application() -> None:
    now = T0 + 7200
    events = [_ev(t, 13, uuid=u, pid=p) for u in (UUID, OTHER) for t, p in ((0, 1), (900, 2), (1800, 3))]
    assert conditions(_store(*events, now=now), now, RulesConfig()) == []


def test_fatal_xids_coming_back_within_a_day_are_a_support_case() -> None:
    now = T0 + 20000
    # Xid 48 with its 63 and 94s in one second is one episode; three episodes hours apart are three.
    episode = [_ev(0, 48), _ev(0.2, 63), _ev(0.4, 94), _ev(0.5, 94)]
    two = [*episode, _ev(7000, 79)]
    assert conditions(_store(*two, now=now), now, RulesConfig()) == []
    (c,) = conditions(_store(*two, _ev(14000, 119), now=now), now, RulesConfig())
    assert (c.name, c.severity, c.value) == (SUPPORT_CASE, "critical", 3.0)
    assert "3 fatal Xid episodes" in c.summary and "(Xid 48, 79, 119)" in c.summary
    assert "nvidia-bug-report.sh" in c.annotations["action"]


def test_thresholds_are_config_and_the_window_ages_out() -> None:
    cfg = validate(RulesConfig, {"xid_repeat": {"fatal_count": 2, "window": "1h"}})
    events = [_ev(0, 79), _ev(1000, 79)]
    assert _names(conditions(_store(*events, now=T0 + 2000), T0 + 2000, cfg)) == [(SUPPORT_CASE, UUID)]
    assert conditions(_store(*events, now=T0 + 4000), T0 + 4000, cfg) == []  # the first is older than 1h now
    assert conditions(_store(*events, now=T0 + 2000), T0 + 2000, RulesConfig()) == []  # default: 3 episodes
