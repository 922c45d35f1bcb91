"""`gpuwatchd sim --scenario gpm-training` end to end: the real daemon, its NVML worker on the real pynvml and the
stand-in's GPM calls, read over HTTP while the training steps go by."""

from __future__ import annotations

from pathlib import Path

from support import DaemonProcess, Samples, labels_of, value, wait_until
from test_sim_cli import interrupt, sim, start_sim

__all__ = ["sim"]  # the fixture, used by name


def test_gpm_training_activity_follows_the_steps(sim: list[DaemonProcess], tmp_path: Path) -> None:
    d = start_sim(sim, tmp_path, "--scenario", "gpm-training", "--speed", "2")
    uuids: set[str] = set()
    seen: dict[str, list[tuple[float, float]]] = {}  # uuid -> (SM activity, utilization) per scrape

    def a_whole_step_seen() -> Samples | None:
        m = d.metrics()
        for lab in labels_of(m, "gpuwatchd_gpu_sm_activity_ratio"):
            u = lab["uuid"]
            uuids.add(u)
            sm = value(m, "gpuwatchd_gpu_sm_activity_ratio", uuid=u)
            util = value(m, "gpuwatchd_gpu_utilization_ratio", uuid=u)
            assert sm is not None and util is not None
            seen.setdefault(u, []).append((sm, util))
        steps = [s for s in seen.values() if max(sm for sm, _ in s) >= 0.85 and min(sm for sm, _ in s) <= 0.6]
        return m if len(uuids) == 8 and len(steps) == 8 else None

    # Busy passes (SMs ~90% active) and the data-load / all-reduce / optimizer stretch (well below) on every GPU.
    m = wait_until(a_whole_step_seen, "every GPU's SM activity through a whole training step", timeout=90)
    for samples in seen.values():
        # NVML's utilization says "a kernel ran" all along, even while the SMs were mostly idle: what GPM adds.
        assert all(util >= 0.6 for _, util in samples)
        assert all(0.0 <= sm <= 1.0 for sm, _ in samples)
    u = sorted(uuids)[0]
    assert {lab["pipe"] for lab in labels_of(m, "gpuwatchd_gpu_tensor_pipe_activity_ratio", uuid=u)} == {
        "hmma", "imma", "dfma", "dmma"}
    assert {lab["direction"] for lab in labels_of(m, "gpuwatchd_gpu_nvlink_average_bytes_per_second", uuid=u)} == {
        "tx", "rx"}
    assert value(m, "gpuwatchd_gpu_pipe_activity_ratio", uuid=u, pipe="fp64") == 0.0
    assert value(m, "gpuwatchd_gpu_sm_occupancy_ratio", uuid=u) == 0.45
    assert value(m, "gpuwatchd_gpu_field_error_info") is None  # nothing failed
    assert "Traceback" not in d.log()
    assert interrupt(d) == 0
