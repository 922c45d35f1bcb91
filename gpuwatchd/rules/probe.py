"""``GpuProbeFailed`` (a probe found wrong results, or the worker crashed or hung) and ``GpuPerformanceDegraded``
(a measure below ``rules.probe.degraded_ratio`` of the GPU's baseline or its link's expectation on two
consecutive runs). Reads the probe ledger the probe service keeps in the store (docs/probes.md).

A failure holds until the same probe passes again (the next run, an hour later by default), so ``for:`` is 0:
the run itself is the evidence. GpuLost/GpuRemoved inhibit both, per GPU, like every GPU alert.
"""

from __future__ import annotations

from gpuwatchd.model.probes import WORKER
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig
from gpuwatchd.store.probes import ProbeLedger

FAILED = "GpuProbeFailed"
DEGRADED = "GpuPerformanceDegraded"

FAILED_DESCRIPTION = (
    "A health probe found this GPU computing wrong numbers, losing data in memory, raising CUDA errors, or the "
    "probe itself crashed or hung: results of jobs on it cannot be trusted."
)
WORKER_DESCRIPTION = (
    "The probe worker crashed or did not finish within probes.deadline and was killed: the driver or GPU may be "
    "stalling: check the daemon log and `dmesg` for Xid errors."
)
DEGRADED_DESCRIPTION = (
    "The GPU computes correctly but slower than its own baseline (or its PCIe link moves data slower than the "
    "link should allow) on two runs in a row."
)


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    ledger = getattr(view, "probes", None)
    if not isinstance(ledger, ProbeLedger):
        return []
    out: list[Condition] = []
    for (uuid, probe), rec in sorted(ledger.last.items()):
        base = {**gpu_labels(view, uuid), "probe": probe}
        title = gpu_title(base)
        if not rec.success:
            what = "" if probe == WORKER else f"{probe} probe failed: "
            summary = f"{title}: {what}{rec.problem}"
            out.append(Condition(FAILED, "critical", base, summary,
                                 WORKER_DESCRIPTION if probe == WORKER else FAILED_DESCRIPTION,
                                 value=float(rec.errors)))
            continue
        prev = ledger.previous.get((uuid, probe))
        if rec.result == "degraded" and prev is not None and prev.result == "degraded":
            worst = min(rec.ratios.values(), default=None)
            out.append(Condition(DEGRADED, "warning", base,
                                 f"{title}: {probe} probe: " + "; ".join(rec.degraded.values()),
                                 DEGRADED_DESCRIPTION, value=worst))
    return out
