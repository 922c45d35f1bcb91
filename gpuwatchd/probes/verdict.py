"""Judging one worker result: what went wrong (with numbers), which measures it took, how they compare.

Pure functions over the worker's JSON (``gpuwatchd.probes.worker``); the ledger keeps the outcome, the rules
(``gpuwatchd.rules.probe``) turn it into alerts, the exporter into metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.gpu.pcie_bandwidth import LinkExpectation
from gpuwatchd.model.probes import Result

# Measures where lower is better (the ratio to baseline is inverted so that < 1 always means worse).
LOWER_IS_BETTER = frozenset({"launch.latency"})
LINK_MEASURES = frozenset({"pcie.h2d", "pcie.d2h"})


@dataclass(frozen=True, slots=True)
class Judged:
    """One probe's part of a run, judged."""

    probe: str
    result: Result
    errors: int = 0  # mismatching elements/words
    problem: str | None = None  # what was wrong, with numbers (fail/error)
    measures: Mapping[str, float] = field(default_factory=dict)  # "pcie.h2d" -> bytes/s etc.
    extras: Mapping[str, float] = field(default_factory=dict)  # exported only: "gemm.flops_float32" ...


def fmt_count(n: int) -> str:
    return f"{n:,}"


def judge_probe(probe: str, entry: Mapping[str, Any]) -> Judged:
    """The checks of one probe entry of a worker result (performance is judged later, against baselines)."""
    status = entry.get("status")
    if status == "oom":
        return Judged(probe, "oom", problem=str(entry.get("error") or "out of memory"))
    if status != "ok":
        return Judged(probe, "error", problem=str(entry.get("error") or "the probe raised an error"))
    res = entry.get("result") or {}
    if probe == "gemm":
        return _gemm(res)
    if probe == "memory":
        errors = int(res.get("mismatched_words") or 0)
        d2d = _pos(res.get("d2d_bytes_per_second"))
        problem = None
        if errors:
            problem = (f"{fmt_count(errors)} mismatching 32-bit words in {res.get('patterns')} pattern passes over "
                       f"{_gib(res.get('bytes'))} (walking ones/zeros, seeded random block)")
        return Judged(probe, "fail" if errors else "pass", errors, problem, {"memory.d2d": d2d} if d2d else {})
    if probe == "pcie":
        measures = {f"pcie.{d}": v for d in ("h2d", "d2h") if (v := _pos(res.get(f"{d}_bytes_per_second")))}
        if res.get("roundtrip_ok") is False:
            return Judged(probe, "fail", 1, "data copied to the GPU and back came back different", measures)
        return Judged(probe, "pass", 0, None, measures)
    if probe == "launch":
        lat = _pos(res.get("latency_seconds"))
        return Judged(probe, "pass", 0, None, {"launch.latency": lat} if lat else {})
    return Judged(probe, "error", problem=f"unknown probe {probe!r} in the worker's result")


def _gemm(res: Mapping[str, Any]) -> Judged:
    problems: list[str] = []
    errors = 0
    measures: dict[str, float] = {}
    for dtype, d in (res.get("dtypes") or {}).items():
        elements = int(d.get("elements") or 0)
        nonfinite, ref_bad, run_bad = (int(d.get(k) or 0) for k in ("nonfinite", "reference_mismatch", "run_mismatch"))
        if nonfinite:
            problems.append(f"{fmt_count(nonfinite)} of {fmt_count(elements)} {dtype} elements are NaN or Inf")
        if ref_bad:
            err = d.get("max_error")
            worst = f", max error {err:.1e}" if isinstance(err, int | float) else ", max error NaN/Inf"
            checked = int(d.get("reference_elements") or elements)
            problems.append(f"{fmt_count(ref_bad)} of {fmt_count(checked)} {dtype} elements differ from the float64 "
                            f"reference{worst}")
        if run_bad:
            problems.append(f"{fmt_count(run_bad)} of {fmt_count(elements)} {dtype} elements differ between two "
                            "runs of the same computation")
        errors += max(nonfinite, ref_bad, run_bad)
        if (f := _pos(d.get("flops"))) is not None:
            measures[f"gemm.flops_{dtype}"] = f
    if errors:
        return Judged("gemm", "fail", errors, "; ".join(problems), measures)
    return Judged("gemm", "pass", 0, None, measures)


def _pos(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def _gib(v: Any) -> str:
    return f"{float(v or 0) / (1 << 30):.2f} GiB" if (v or 0) >= 1 << 30 else f"{float(v or 0) / (1 << 20):.0f} MiB"


def ratio(key: str, value: float, baseline: float) -> float:
    """value vs baseline, as a share where < 1 is always worse."""
    return baseline / value if key in LOWER_IS_BETTER else value / baseline


def fmt_measure(key: str, value: float) -> str:
    """``H2D 2.1 GB/s``, ``float32 7.9 TFLOP/s``, ``D2D 410 GB/s``, ``launch latency 9 µs``."""
    if key.startswith("gemm.flops_"):
        return f"{key.removeprefix('gemm.flops_')} {value / 1e12:.2g} TFLOP/s" if value >= 1e11 else (
            f"{key.removeprefix('gemm.flops_')} {value / 1e9:.1f} GFLOP/s")
    if key == "launch.latency":
        return f"launch latency {value * 1e6:.0f} µs" if value >= 1e-5 else f"launch latency {value * 1e6:.1f} µs"
    label = {"pcie.h2d": "H2D", "pcie.d2h": "D2H", "memory.d2d": "D2D"}.get(key, key)
    return f"{label} {fmt_rate(value)}"


def fmt_rate(bps: float) -> str:
    return f"{bps / 1e9:.1f} GB/s" if bps < 100e9 else f"{bps / 1e9:.0f} GB/s"


def degraded_problem(key: str, value: float, base: float | None, link: LinkExpectation | None,
                     threshold: float) -> str | None:
    """Why a measure is degraded (None when it is not): against the link first, then the GPU's own baseline."""
    if key in LINK_MEASURES and link is not None and value / link.bytes_per_second < threshold:
        tail = f"; baseline {fmt_rate(base)}" if base is not None else ""
        return (f"{fmt_measure(key, value)}, {round(100 * value / link.bytes_per_second)}% of what {link.name} "
                f"should give{tail}")
    if base is None:
        return None
    r = ratio(key, value, base)
    if r >= threshold:
        return None
    if key in LOWER_IS_BETTER:
        return f"{fmt_measure(key, value)}, {1 / r:.1f}x this GPU's baseline of {base * 1e6:.1f} µs"
    base_text = fmt_measure(key, base).split(" ", 1)[1]
    return f"{fmt_measure(key, value)}, {round(100 * r)}% of this GPU's baseline {base_text}"
