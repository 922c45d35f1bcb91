"""Messages with numbers, and the link expectation, from worker results (no torch)."""

from __future__ import annotations

from gpuwatchd.gpu.pcie_bandwidth import expectation
from gpuwatchd.probes.verdict import degraded_problem, judge_probe


def test_gemm_failure_message_names_counts_and_error() -> None:
    entry = {"status": "ok", "result": {"n": 4096, "dtypes": {"float32": {
        "elements": 16_777_216, "reference_elements": 16_777_216, "run_mismatch": 0, "reference_mismatch": 3,
        "nonfinite": 0, "max_error": 412.3, "flops": 1e13}}}}
    j = judge_probe("gemm", entry)
    assert j.result == "fail" and j.errors == 3
    assert j.problem == "3 of 16,777,216 float32 elements differ from the float64 reference, max error 4.1e+02"


def test_link_expectation_and_message() -> None:
    gen3x4 = expectation(3, 4)
    assert gen3x4 is not None and gen3x4.name == "PCIe Gen3 x4"
    assert 3.1e9 < gen3x4.bytes_per_second < 3.2e9
    tb = expectation(4, 4, thunderbolt=True)
    assert tb is not None and tb.name == "a Thunderbolt 3/4 tunnel (PCIe Gen3 x4)" and tb.bytes_per_second == 2.75e9
    assert expectation(None, 4) is None
    msg = degraded_problem("pcie.h2d", 1.2e9, 3.1e9, gen3x4, 0.8)
    assert msg == "H2D 1.2 GB/s, 38% of what PCIe Gen3 x4 should give; baseline 3.1 GB/s"
    assert degraded_problem("pcie.h2d", 2.9e9, 3.1e9, gen3x4, 0.8) is None
    assert degraded_problem("gemm.flops_float32", 4e12, 8e12, None, 0.8) == (
        "float32 4 TFLOP/s, 50% of this GPU's baseline 8 TFLOP/s")
    assert degraded_problem("launch.latency", 50e-6, 10e-6, None, 0.8) == (
        "launch latency 50 µs, 5.0x this GPU's baseline of 10.0 µs")
