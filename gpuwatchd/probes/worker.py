"""``python -m gpuwatchd.probes.worker``: one probe run on one GPU, one JSON line on stdout, then exit.

The only module that imports torch. The runner (``gpuwatchd.probes.runner``) starts it pinned to one GPU by
``CUDA_VISIBLE_DEVICES=<uuid>``, in its own process group, under a hard deadline; it exits after the run so no
CUDA context (hundreds of MiB of the user's GPU memory) stays behind. ``--device cpu`` runs the same probes on
torch's CPU device at small sizes (tests, ``gpuwatchd sim``). ``--check`` only reports whether probes can run.

Output (one line): ``{"v": 1, "device": ..., "torch": ..., "cuda": ..., "probes": {name: {"status": "ok" |
"error" | "oom", "error": ..., "seconds": ..., "result": {...}}}}``; or for ``--check``: ``{"v": 1, "check":
{"available": bool, "reason": ..., ...}}``. Anything else on stdout/stderr is a fault the runner reports.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import warnings
from typing import Any

from gpuwatchd.probes import gemm, launch, memory, pcie
from gpuwatchd.probes.context import ProbeContext, Sizes
from gpuwatchd.probes.faults import ProbeFaults, faults_from_json
from gpuwatchd.probes.runner import PARENT_ENV

PROBES = {"gemm": gemm.run, "memory": memory.run, "pcie": pcie.run, "launch": launch.run}
PROBE_NAMES = tuple(PROBES)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
MIB = 1 << 20


def _die_with_parent(parent: int) -> None:
    """SIGKILL us when the daemon dies (even inside a hung CUDA call), and catch a parent already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n")
    sys.stdout.flush()


def check(torch: Any) -> dict[str, Any]:
    """Can probes run on a GPU here? The reasons are those of ``gpuwatchd_probe_unavailable_info``."""
    cuda = torch.version.cuda
    out: dict[str, Any] = {"torch": torch.__version__, "cuda": cuda, "available": False, "reason": None}
    if cuda is None:
        out["reason"] = "torch_without_cuda"
        return out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = bool(torch.cuda.is_available())
    text = " ".join(str(w.message) for w in caught)
    if ok:
        out["available"] = True
        out["device_count"] = int(torch.cuda.device_count())  # what CUDA_VISIBLE_DEVICES lets torch see
    elif "too old" in text or "insufficient for CUDA runtime" in text:
        out["reason"] = "driver_too_old"
        out["detail"] = text[:300]
    else:
        out["reason"] = "no_cuda_device"
        out["detail"] = text[:300] or None
    return out


def _sizes(torch: Any, args: argparse.Namespace) -> tuple[Sizes, int | None]:
    if args.device == "cpu":
        return Sizes(args.gemm_n, args.memory_bytes, args.transfer_bytes), None
    free, _total = torch.cuda.mem_get_info()
    budget = int(free * args.memory_share)
    mem = min(args.memory_bytes, budget)
    # GEMM: A, B, two results, in fp32, plus the half-precision copies: about 6 n^2 x 4 bytes.
    n = args.gemm_n
    while n > 256 and 24 * n * n > budget:
        n //= 2
    return Sizes(n, mem, min(args.transfer_bytes, max(1 << 16, budget // 4))), int(free)


def run_probes(torch: Any, args: argparse.Namespace, faults: ProbeFaults) -> dict[str, Any]:
    ctx = ProbeContext(torch, args.device, faults)
    sizes, free = _sizes(torch, args)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    out: dict[str, Any] = {"v": 1, "device": args.device, "torch": torch.__version__, "cuda": torch.version.cuda,
                           "device_name": name, "free_bytes": free, "probes": {}}
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    for probe in args.probe or PROBE_NAMES:
        t0 = time.perf_counter()
        entry: dict[str, Any]
        try:
            if faults.crash == "oom" and probe == "gemm":
                raise oom("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            entry = {"status": "ok", "result": PROBES[probe](ctx, sizes)}
        except oom as e:
            # The user's allocation wins: the probe gives its memory back and counts as skipped.
            entry = {"status": "oom", "error": str(e).splitlines()[0][:300]}
            if args.device == "cuda":
                torch.cuda.empty_cache()
        except RuntimeError as e:
            entry = {"status": "error", "error": str(e).splitlines()[0][:300] if str(e) else type(e).__name__}
        entry["seconds"] = time.perf_counter() - t0
        out["probes"][probe] = entry
        if entry["status"] == "error":
            break  # a CUDA error poisons the context: the rest would only repeat it
    return out


def _crash(kind: str | None, result: dict[str, Any]) -> None:
    if kind == "exit":
        sys.stderr.write("probe worker: injected crash\n")
        sys.stderr.flush()
        os._exit(1)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "garbage":
        sys.stdout.write("Segmentation fault? no: just garbage on stdout\n")
        sys.stdout.flush()
        os._exit(0)
    if kind == "truncated":
        text = json.dumps(result)
        sys.stdout.write(text[: len(text) // 2])
        sys.stdout.flush()
        os._exit(0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gpuwatchd.probes.worker")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--probe", action="append", choices=PROBE_NAMES)
    p.add_argument("--check", action="store_true", help="only say whether probes can run here")
    p.add_argument("--gemm-n", type=int, default=2048)
    p.add_argument("--memory-bytes", type=int, default=1024 * MIB)
    p.add_argument("--memory-share", type=float, default=0.25)
    p.add_argument("--transfer-bytes", type=int, default=256 * MIB)
    p.add_argument("--threads", type=int, default=1, help="CPU threads torch may use")
    p.add_argument("--inject", help="probe faults as JSON (simulation only; refused unless --device cpu)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    expected = os.environ.get(PARENT_ENV, "")
    _die_with_parent(int(expected) if expected.isdigit() else os.getppid())
    faults = ProbeFaults()
    if args.inject:
        if args.device != "cpu":
            sys.stderr.write("probe worker: --inject is for simulated GPUs (--device cpu) only\n")
            return 2
        faults = faults_from_json(args.inject)
    if faults.hang:
        while True:  # an unresponsive driver call: only the runner's deadline ends this
            time.sleep(3600)
    try:
        import torch
    except ImportError as e:
        if not args.check:
            raise
        # `gpuwatchd doctor` asks this interpreter whether torch is there at all: an answer, not a crash.
        _emit({"v": 1, "check": {"torch": None, "cuda": None, "available": False, "reason": "torch_not_installed",
                                 "detail": str(e)[:300]}})
        return 0

    torch.set_num_threads(max(1, args.threads))
    if args.check:
        _emit({"v": 1, "check": check(torch)})
        return 0
    result = run_probes(torch, args, faults)
    _crash(faults.crash, result)
    _emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
