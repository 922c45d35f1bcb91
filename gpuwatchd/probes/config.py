"""``probes:``: when and how hard the torch health probes run (docs/probes.md).

```yaml
probes:
  interval: 1h
  idle_for: 5m
  gemm: true
  memory: {}          # per-probe switches are plain booleans: memory: false
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from gpuwatchd.config.types import Duration, Section, replace

MIB = 1 << 20
PROBE_NAMES = ("gemm", "memory", "pcie", "launch")


class ProbesConfig(Section, frozen=True):
    """Torch health probes on idle GPUs (needs the `gpuwatchd[probes]` extra: torch)."""

    enabled: bool = True
    # Per GPU, how often a probe run is due. 1 h: a run costs ~10-20 s of GPU time (torch start, CUDA context,
    # the probes), so 1 h stays at ~0.5% of the GPU's time, under the 1% duty-cycle cap with room to spare, and
    # a GPU that starts computing wrong numbers is caught within the hour; the 5-run baseline is built in 5 h.
    interval: Annotated[Duration, msgspec.Meta(ge=60.0)] = 3600.0
    # A GPU must have been idle this long (no compute process, utilization under idle_utilization) before a run:
    # 5 min is longer than the pauses inside a job (checkpointing, evaluation), so a probe does not land in them.
    idle_for: Annotated[Duration, msgspec.Meta(ge=0.0)] = 300.0
    # "Idle" utilization ceiling (a desktop compositor keeps a few percent busy).
    idle_utilization: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.05
    # Hard deadline of one run (wall seconds): then the worker's whole process group is killed, a probe failure.
    deadline: Annotated[Duration, msgspec.Meta(ge=5.0, le=3600.0)] = 120.0
    # Probe runs at once on the host. 1: runs do not compete for the CPU, PCIe and memory bandwidth they measure.
    parallel: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # A run still going after this long (wall seconds; a healthy run takes ~10-20 s) is suspected hung: it stops
    # holding its slot, so the other GPUs' probes go ahead while it waits for its deadline. This bounds how long
    # one hung GPU delays the others (docs/probes.md, "Detection bound").
    hang_after: Annotated[Duration, msgspec.Meta(ge=1.0, le=3600.0)] = 45.0
    # Probe time may take at most this share of each GPU's time: after a run of d seconds the next waits at
    # least d / duty_cycle. Enforced, not advisory.
    duty_cycle: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.01
    # The memory test and the GEMM use at most this share of the GPU's free memory ...
    max_memory_share: Annotated[float, msgspec.Meta(gt=0.0, le=0.9)] = 0.25
    # ... and at most this much for the memory pattern test.
    memory_bytes: Annotated[int, msgspec.Meta(ge=MIB, le=1 << 40)] = 1024 * MIB
    # GEMM dimension (n x n x n; halved until it fits max_memory_share).
    gemm_n: Annotated[int, msgspec.Meta(ge=64, le=16384)] = 2048
    # Bytes per host<->device copy in the pcie probe.
    transfer_bytes: Annotated[int, msgspec.Meta(ge=MIB, le=1 << 34)] = 256 * MIB
    # A measure's baseline is the median of its first N healthy runs.
    baseline_runs: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    gemm: bool = True
    memory: bool = True
    pcie: bool = True
    launch: bool = True
    # Interpreter that has torch (a venv with gpuwatchd[probes]); unset: the daemon's own.
    python: Path | None = None

    def check(self) -> None:
        if self.enabled and not self.selected():
            raise ValueError("every probe is switched off: set enabled: false instead")
        if self.idle_for > self.interval:
            raise ValueError("idle_for must not exceed interval")

    def selected(self) -> list[str]:
        return [p for p in PROBE_NAMES if getattr(self, p)]


def sim_probes(cfg: ProbesConfig, explicit: set[str]) -> ProbesConfig:
    """``gpuwatchd sim``'s schedule: minutes, not hours, unless the config file set the key itself.

    A CPU run takes a few seconds, so a 50% cap lets the sim show baselines, failures and recoveries within a
    scenario; the real defaults would need a day of scenario time.
    """
    sim = {"interval": 120.0, "idle_for": 30.0, "duty_cycle": 0.5, "baseline_runs": 3, "deadline": 30.0,
           "hang_after": 10.0}
    return replace(cfg, **{k: v for k, v in sim.items() if k not in explicit})
