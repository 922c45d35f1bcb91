"""``GpuEccError``: memory health from the latest sample, one alert per (GPU, ``kind``).

Conditions and their severities follow DCGM's MEM health watch (``DcgmHealthWatch.cpp``): volatile DBE > 0 -> FAIL,
SBE+DBE retired pages >= 63 -> FAIL, pending retirement -> WARN, row-remap failure -> FAIL. A pending row remap
is a warning: the GPU works but needs a reset to apply the remap (capture q03: "Pending Yes").
"""

from __future__ import annotations

from gpuwatchd.model import GpuSample, Severity
from gpuwatchd.rules import advice
from gpuwatchd.rules.condition import Condition, RuleView, gpu_labels, gpu_title
from gpuwatchd.rules.config import RulesConfig

NAME = "GpuEccError"

RESET = advice.ECC_RESET


def _findings(g: GpuSample, retired_max: int) -> list[tuple[str, Severity, str, str, float]]:
    """(kind, severity, what, what to do, value) for each memory-health problem of one GPU."""
    out: list[tuple[str, Severity, str, str, float]] = []
    dbe = g.ecc_uncorrected_volatile
    if dbe is not None and dbe > 0:
        out.append((
            "dbe_volatile", "critical", f"{dbe} uncorrectable (double-bit) ECC errors since the last reset",
            advice.ECC_DBE,
            float(dbe),
        ))
    if g.retired_pages_sbe is not None or g.retired_pages_dbe is not None:
        retired = (g.retired_pages_sbe or 0) + (g.retired_pages_dbe or 0)
        if retired >= retired_max:
            out.append((
                "retired_pages", "critical", f"{retired} retired memory pages (limit {retired_max})",
                "The page-retirement table is full or nearly so; further errors cannot be retired. Plan an RMA.",
                float(retired),
            ))
    if g.retired_pages_pending:
        out.append((
            "retired_pages_pending", "warning", "page retirement pending",
            "A page is marked for retirement at the next reset. " + RESET, 1.0,
        ))
    if g.remapped_rows_failure:
        out.append((
            "row_remap_failed", "critical", "row remapping failed",
            "The GPU ran out of spare rows for remapping: memory errors can no longer be repaired. Plan an RMA.",
            1.0,
        ))
    if g.remapped_rows_pending:
        unc = g.remapped_rows_uncorrectable
        what = "row remap pending" + (f" ({unc} uncorrectable rows remapped)" if unc else "")
        out.append(("row_remap_pending", "warning", what, "The remap takes effect at the next reset. " + RESET, 1.0))
    return out


def conditions(view: RuleView, now: float, config: RulesConfig) -> list[Condition]:
    """Memory-health conditions of every present GPU."""
    snap = view.latest
    if snap is None:
        return []
    out: list[Condition] = []
    for g in snap.gpus:
        found = _findings(g, config.ecc.retired_pages_max)
        if not found:
            continue
        base = gpu_labels(view, g.uuid)
        for kind, sev, what, todo, value in found:
            out.append(Condition(NAME, sev, {**base, "kind": kind}, f"{gpu_title(base)}: {what}", "", value=value,
                                 annotations={advice.ACTION: todo.replace("<index>", base.get("gpu") or "<index>")}))
    return out
