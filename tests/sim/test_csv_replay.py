"""``gpuwatchd sim --from-csv``: what a replay says about processes, through the stand-in and the real pynvml.

A ``--query-gpu`` log has no process columns: the replayed GPU must not claim an empty process list (with memory
used, that reads as memory held by a dead process: GpuMemoryHeldByDeadProcess fired on every real capture), so its
process lists answer NOT_SUPPORTED. A ``--query-compute-apps`` log lists its processes, and only those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pynvml
import pytest

from gpuwatchd.sim.csv_replay import PROCESS_LISTERS, parse_csv, scenario_from_log
from gpuwatchd.sim.player import state_at

if TYPE_CHECKING:
    from conftest import Sim

GPU_LOG = """timestamp, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]
2026/11/20 10:00:00.100, NVIDIA RTX A5000, 1743 MiB, 24564 MiB, 0 %
2026/11/20 10:00:01.100, NVIDIA RTX A5000, 9120 MiB, 24564 MiB, 97 %
2026/11/20 10:00:02.100, NVIDIA RTX A5000, 9120 MiB, 24564 MiB, 98 %
"""
APPS_LOG = """timestamp, pid, process_name, used_gpu_memory [MiB]
2026/11/20 10:00:00.100, 4242, python3, 7000 MiB
2026/11/20 10:00:01.100, 4242, python3, 7100 MiB
2026/11/20 10:00:02.100, 4242, python3, 7200 MiB
"""


def test_a_gpu_log_replays_process_lists_as_not_supported(sim: Sim) -> None:
    scen = scenario_from_log(parse_csv(GPU_LOG), "gpu.csv")
    state = state_at(scen, 1.5)
    assert state["devices"][0]["memory"]["used"] == 9120 * 1024 * 1024
    sim.update(state)
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used == 9120 * 1024 * 1024
    for call in (n.nvmlDeviceGetComputeRunningProcesses, n.nvmlDeviceGetGraphicsRunningProcesses):
        with pytest.raises(pynvml.NVMLError) as e:
            call(h)
        assert e.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    # the symbols named are the ones pynvml's unversioned wrappers call
    assert {f"{c.__name__}_v3" for c in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                                         pynvml.nvmlDeviceGetGraphicsRunningProcesses)} == set(PROCESS_LISTERS)


def test_a_compute_apps_log_lists_its_processes(sim: Sim) -> None:
    scen = scenario_from_log(parse_csv(APPS_LOG), "apps.csv")
    state = state_at(scen, 1.5)
    assert "errors" not in state["devices"][0]
    sim.update(state)
    n = sim.nvml
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    got = [(p.pid, p.usedGpuMemory) for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
    assert got == [(4242, 7100 * 1024 * 1024)]
    assert n.nvmlDeviceGetGraphicsRunningProcesses(h) == []
