"""The probes on torch's CPU device, in this process (one torch import for the module): healthy runs pass with
positive, finite figures; each injected fault is caught by the check meant for it."""

from __future__ import annotations

import math
from typing import Any

from gpuwatchd.probes.faults import ProbeFaults
from gpuwatchd.probes.verdict import judge_probe
from gpuwatchd.probes.worker import parse_args, run_probes

from .conftest import CPU_ARGS

NO_FAULTS = ProbeFaults()


def _run(torch: Any, faults: ProbeFaults = NO_FAULTS, *probes: str) -> dict[str, Any]:
    args = parse_args([*CPU_ARGS, *(a for p in probes for a in ("--probe", p))])
    return run_probes(torch, args, faults)


def test_healthy_run_passes_with_positive_finite_figures(torch_module: Any) -> None:
    out = _run(torch_module)
    assert set(out["probes"]) == {"gemm", "memory", "pcie", "launch"}
    for name, entry in out["probes"].items():
        assert entry["status"] == "ok", entry
        judged = judge_probe(name, entry)
        assert judged.result == "pass", judged
        assert judged.measures, name
        for v in judged.measures.values():
            assert v > 0 and math.isfinite(v)
    gemm = out["probes"]["gemm"]["result"]["dtypes"]
    assert set(gemm) == {"float32", "bfloat16"}
    assert all(d["run_mismatch"] == 0 and d["reference_mismatch"] == 0 for d in gemm.values())


def test_one_flipped_gemm_element_is_caught(torch_module: Any) -> None:
    out = _run(torch_module, ProbeFaults(gemm_flip=1), "gemm")
    judged = judge_probe("gemm", out["probes"]["gemm"])
    assert judged.result == "fail"
    for d in out["probes"]["gemm"]["result"]["dtypes"].values():
        assert d["reference_mismatch"] == 1  # exactly the flipped element, in every dtype
    assert judged.problem is not None
    assert "1 of 9,216 float32 elements differ from the float64 reference" in judged.problem


def test_stuck_memory_bits_are_counted(torch_module: Any) -> None:
    out = _run(torch_module, ProbeFaults(stuck_bits=3), "memory")
    judged = judge_probe("memory", out["probes"]["memory"])
    assert judged.result == "fail"
    # Bit 3 stuck at 1 in 3 words: wrong in 31 of the walking-ones patterns and 1 walking-zeros pattern each,
    # plus wherever the random block had that bit clear.
    assert 3 * 32 <= judged.errors <= 3 * 33
    assert judged.problem is not None and "mismatching 32-bit words" in judged.problem


def test_nan_cuda_error_and_oom(torch_module: Any) -> None:
    nan = judge_probe("gemm", _run(torch_module, ProbeFaults(nan=True), "gemm")["probes"]["gemm"])
    assert nan.result == "fail" and nan.problem is not None and "NaN or Inf" in nan.problem
    err = _run(torch_module, ProbeFaults(cuda_error="an illegal memory access was encountered"), "gemm", "launch")
    assert list(err["probes"]) == ["gemm"]  # a CUDA error poisons the context: the run stops there
    judged = judge_probe("gemm", err["probes"]["gemm"])
    assert judged.result == "error" and judged.problem == "CUDA error: an illegal memory access was encountered"
    oom = _run(torch_module, ProbeFaults(crash="oom"), "gemm", "launch")
    assert oom["probes"]["gemm"]["status"] == "oom" and oom["probes"]["launch"]["status"] == "ok"
