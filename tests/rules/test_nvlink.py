"""``GpuNvlinkErrors``: DCGM's NVLink health thresholds over the store's history of per-link counters."""

from __future__ import annotations

from gpuwatchd.model import Alert
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.rules.engine import RulesEngine
from gpuwatchd.store import Store

from .conftest import T0, gpu, run, snap


def _alerts(per_second: dict[str, float], *, link: str = "3", end: float = 120.0) -> list[Alert]:
    """Firing GpuNvlinkErrors after ``end`` s of counters rising at ``per_second`` (kind -> errors/s) on ``link``."""
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    eng = RulesEngine(RulesConfig(), host="node1")

    def make(t: float) -> object:
        counts = {k: int((t - T0) * r) for k, r in per_second.items()}
        errors = {"0": {"crc_flit": 7, "crc_data": 0, "replay": 0, "recovery": 0},
                  link: {"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0, **counts}}
        return snap(t, gpu(index=5, name="NVIDIA H100 80GB HBM3", nvlink_errors_total=errors))

    hist = run(store, eng, make, start=T0, end=T0 + end, every=15)  # type: ignore[arg-type]
    return [a for a in hist[-1][1] if a.name == "GpuNvlinkErrors" and a.state == "firing"]


def test_crc_errors_below_dcgms_fail_rate_warn_and_name_gpu_and_link() -> None:
    (a,) = _alerts({"crc_flit": 3.0})
    assert (a.severity, a.labels["gpu"], a.labels["link"]) == ("warning", "5", "3")
    assert a.summary == ("GPU 5 (NVIDIA H100 80GB HBM3): NVLink 3: 180 CRC flit errors in the last 1m "
                         "(3.0 CRC errors/s; DCGM warns at any CRC error and fails at 100/s)")


def test_crc_at_100_per_second_or_any_replay_is_critical() -> None:
    (a,) = _alerts({"crc_data": 150.0})
    assert a.severity == "critical" and "DCGM fails a link at 100 CRC errors/s" in a.summary
    (b,) = _alerts({"replay": 0.05}, link="11")
    assert (b.severity, b.labels["link"]) == ("critical", "11")
    assert "3 replay errors" in b.summary and "fail DCGM's NVLink health check" in b.summary


def test_steady_counters_and_a_reset_alone_do_not_fire() -> None:
    assert _alerts({}) == []
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    eng = RulesEngine(RulesConfig(), host="node1")
    # a counter that drops to 0 (driver reload) and stays there: nothing rose
    hist = run(store, eng, lambda t: snap(t, gpu(nvlink_errors_total={"0": {"crc_flit": 500 if t < T0 + 30 else 0}})),
               start=T0, end=T0 + 120, every=15)
    assert [a for _, alerts in hist for a in alerts if a.name == "GpuNvlinkErrors"] == []


def test_resolution_says_the_link_is_quiet_again() -> None:
    store = Store(retention_seconds=3600.0, step_seconds=5.0)
    eng = RulesEngine(RulesConfig(), host="node1")

    def make(t: float) -> object:
        flit = int(min(t - T0, 60.0) * 2)  # 2/s for a minute, then nothing
        return snap(t, gpu(nvlink_errors_total={"2": {"crc_flit": flit, "replay": 0}, "5": {"crc_flit": 9}}))

    hist = run(store, eng, make, start=T0, end=T0 + 800, every=15)  # type: ignore[arg-type]
    notified = [a for _, alerts in hist for a in alerts if a.name == "GpuNvlinkErrors"]
    assert {a.labels["link"] for a in notified} == {"2"}
    (last,) = [a for a in hist[-1][1] if a.name == "GpuNvlinkErrors"]
    assert last.state == "resolved"  # 10 min of keep_firing_for after the last rise
    assert last.summary == "GPU 0 (NVIDIA A10G): NVLink 2: no new errors in the last 1m (CRC flit 120, replay 0 in all)"
