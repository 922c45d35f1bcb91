"""``gemm``: silent data corruption check and achieved FLOP/s.

Fixed-seed inputs, multiplied twice on the device in each dtype; the two results must be bit-identical (same
kernel, same inputs: any difference is the hardware), and must match a float64 CPU reference within the
rounding error the dtype can make over the inner dimension ``n``. Products accumulate in float32 (the worker
turns TF32 and reduced-precision reductions off), so the bound is ``|C - ref| <= 2 n u32 (|A||B|) + 2 u |ref|``:
the deterministic accumulation bound (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.13) plus the
output's rounding to the dtype (unit roundoff ``u``). A healthy GPU never exceeds it; a flipped exponent bit or
a high mantissa bit does.
"""

from __future__ import annotations

import time
from typing import Any

from gpuwatchd.probes.context import ProbeContext, Sizes, finite

SEED = 20240917
# Unit roundoff per dtype name: 2^-(mantissa bits + 1).
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# The float64 CPU reference covers at most this many rows (a full 8192^3 float64 product would take minutes of
# CPU); rows are chosen by the seed. The bit-compare always covers every element.
MAX_REFERENCE_ROWS = 256
FLOPS_MIN_SECONDS = 0.05


def tolerance(dtype: str, n: int, abs_product: Any, ref_abs: Any) -> Any:
    """Per-element bound on |C - ref| for a dtype over inner dimension ``n`` (tensors in, tensor out)."""
    return 2.0 * n * UNIT_ROUNDOFF["float32"] * abs_product + 2.0 * UNIT_ROUNDOFF[dtype] * ref_abs


def _dtypes(ctx: ProbeContext) -> list[str]:
    torch = ctx.torch
    # Every CPU torch has bf16 matmul; GPUs before Ampere have fp16 only.
    half = "bfloat16" if not ctx.on_gpu or torch.cuda.is_bf16_supported() else "float16"
    return ["float32", half]


def run(ctx: ProbeContext, sizes: Sizes) -> dict[str, Any]:
    torch = ctx.torch
    n = sizes.gemm_n
    if ctx.on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 must be fp32: TF32 has a 10-bit mantissa
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    gen = torch.Generator().manual_seed(SEED)
    a64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    b64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    rows = torch.randperm(n, generator=gen)[: min(n, MAX_REFERENCE_ROWS)].sort().values
    out: dict[str, Any] = {}
    for name in _dtypes(ctx):
        dt = getattr(torch, name)
        a, b = a64.to(dt).to(ctx.device), b64.to(dt).to(ctx.device)
        c1 = _product(ctx, a, b, 0)
        c2 = _product(ctx, a, b, 1)
        itype = torch.int32 if name == "float32" else torch.int16
        run_mismatch = int((c1.view(itype) != c2.view(itype)).sum().item())
        c = c1.to("cpu", torch.float64)[rows]
        # The reference multiplies the inputs as the device saw them (already rounded to the dtype).
        ar, br = a.to("cpu", torch.float64)[rows], b.to("cpu", torch.float64)
        ref = ar @ br
        bound = tolerance(name, n, ar.abs() @ br.abs(), ref.abs())
        nonfinite = int((~torch.isfinite(c1)).sum().item())
        err = (c - ref).abs()
        err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
        bad = int((err > bound).sum().item())
        max_err = float(err.max().item()) if err.numel() else 0.0
        seconds = _time_products(ctx, a, b)
        flops = 2.0 * n**3 / seconds * ctx.faults.flops_factor
        out[name] = {
            "elements": n * n,
            "reference_elements": int(c.numel()),
            "run_mismatch": run_mismatch,
            "reference_mismatch": bad,
            "nonfinite": nonfinite,
            "max_error": finite(max_err),
            "flops": finite(flops),
        }
    return {"n": n, "dtypes": out}


def _product(ctx: ProbeContext, a: Any, b: Any, which: int) -> Any:
    c = a @ b
    ctx.sync()
    f = ctx.faults
    if f.cuda_error:
        raise RuntimeError(f"CUDA error: {f.cuda_error}")
    flat = c.view(-1)
    if f.gemm_flip:
        # Flip an exponent bit (x or / 2^16 in fp32/bf16, 2^8 in fp16) of the same elements in both runs:
        # corruption that repeats, which only the reference catches (the bit-compare catches one-off flips).
        # The elements are the largest of a seeded sample, so the flip is always far outside the tolerance.
        torch = ctx.torch
        gen = torch.Generator().manual_seed(SEED + 1)
        sample = torch.randperm(flat.numel(), generator=gen)[: max(64, 4 * f.gemm_flip)].to(c.device)
        order = flat[sample].float().abs().argsort(descending=True)
        idx = sample[order[: f.gemm_flip]]
        bits = {torch.float32: (torch.int32, 1 << 27), torch.bfloat16: (torch.int16, 1 << 11)}
        itype, bit = bits.get(c.dtype, (torch.int16, 1 << 13))
        ints = flat.view(itype)
        ints[idx] = ints[idx] ^ bit
    if f.nan and which == 0:
        flat[0] = float("nan")
    return c


def _time_products(ctx: ProbeContext, a: Any, b: Any) -> float:
    """Seconds per product, repeated until ``FLOPS_MIN_SECONDS`` so a fast GPU is timed over many kernels."""
    reps = 1
    while True:
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        ctx.sync()
        dt = time.perf_counter() - t0
        if dt >= FLOPS_MIN_SECONDS or reps >= 256:
            return max(dt / reps, 1e-9)
        reps *= 4
