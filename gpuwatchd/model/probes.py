"""The probes' vocabulary and outcomes as values: results, one probe's record, one GPU's verdict.

Judged by ``gpuwatchd.probes.verdict``, held by the store (``gpuwatchd.store.probes.ProbeLedger``), turned into
alerts by ``gpuwatchd.rules.probe`` and into metrics by ``gpuwatchd.exporter.probe_families``. No I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# runs_total{result}: pass, degraded (a measure below its share of baseline or link), fail (wrong numbers),
# error (CUDA error), crash (worker died or printed no result), timeout (killed at the deadline), oom (the user's
# memory won: a skip), cancelled (a user's job started: killed to get out of its way).
Result = Literal["pass", "degraded", "fail", "error", "crash", "timeout", "oom", "cancelled"]
FAILED: frozenset[str] = frozenset({"fail", "error", "crash", "timeout"})
WORKER = "worker"  # the probe label of a whole-run failure (crash, timeout): no single probe is to blame


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One probe's outcome in one run on one GPU."""

    uuid: str
    probe: str  # gemm, memory, pcie, launch, or "worker" for a whole-run failure
    result: Result
    timestamp: float  # end of the run (daemon clock)
    duration_seconds: float
    errors: int = 0
    problem: str | None = None  # fail/error/crash/timeout: what was wrong, with numbers
    measures: Mapping[str, float] = field(default_factory=dict)  # "pcie.h2d" -> bytes/s ...
    ratios: Mapping[str, float] = field(default_factory=dict)  # measure -> share of baseline (< 1 worse)
    degraded: Mapping[str, str] = field(default_factory=dict)  # measure -> why it is below its share

    @property
    def success(self) -> bool:
        return self.result not in FAILED


@dataclass(frozen=True, slots=True)
class Verdict:
    """The last run on one GPU, summarised for ``gpuwatchd status``."""

    verdict: str  # pass, degraded, FAILED, skipped (reason), building baseline
    timestamp: float
    detail: str | None = None
