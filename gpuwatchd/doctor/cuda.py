"""CUDA: the highest CUDA version the driver supports (NVML) vs the CUDA torch was built for, whether torch can use
the GPUs, and whether it sees as many as NVML (``CUDA_VISIBLE_DEVICES``). torch runs in a child process with a
deadline: ``torch.cuda`` initialisation can hang on a wedged GPU, and the daemon never imports torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.nvml_probe import NvmlFacts, run_child
from gpuwatchd.doctor.report import Result, fail, ok, warn
from gpuwatchd.doctor.wheels import FAMILY_MIN_DRIVER, choose, no_build_why, runs_on, text
from gpuwatchd.runtime.json_answer import json_objects

G = "cuda"
# The probe worker's availability check (the one torch importer, as for the probes themselves): one JSON line.
CHECK_ARGV = ("-m", "gpuwatchd.probes.worker", "--check", "--device", "cuda")
# Another interpreter (`doctor --python`, `probes.python`: the environment that trains) may not have gpuwatchd at
# all: it runs probes/foreign_check.py by path, which asks torch directly in the same terms as the worker's check.
# ``-I``: nothing from the caller's environment or current directory is imported in its place.
FOREIGN_CHECK = Path(__file__).resolve().parents[1] / "probes" / "foreign_check.py"


def cuda_text(v: int) -> str:
    """NVML's 12020 -> ``12.2``."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _as_int(text: str) -> int | None:
    """``"12.4"`` -> 12040, NVML's encoding."""
    try:
        major, minor = [*text.split("."), "0"][:2]
        return int(major) * 1000 + int(minor) * 10
    except ValueError:
        return None


def probe_torch(host: Host) -> dict[str, Any]:
    """The installed torch's build and view of the GPUs, from a child process killed at the deadline."""
    if host.torch_facts is not None:
        return host.torch_facts
    own = host.python == sys.executable
    argv = [host.python, *CHECK_ARGV] if own else [host.python, "-I", str(FOREIGN_CHECK)]
    try:
        run = run_child(host, argv)
    except OSError as e:
        return {"installed": None, "error": f"could not start {host.python}: {e}"}
    if run.timed_out:
        return {"installed": True, "timed_out": True}
    for msg in reversed(list(json_objects(run.out))):  # bounded: a foreign interpreter may print anything
        chk = msg.get("check")
        if isinstance(chk, dict):
            return torch_facts(chk)
    return {"installed": None, "error": (run.err.strip().splitlines() or [f"exit {run.returncode}"])[-1]}


def torch_facts(chk: dict[str, Any]) -> dict[str, Any]:
    """The worker's ``--check`` answer in the terms of the checks below."""
    if chk.get("reason") == "torch_not_installed":
        return {"installed": False}
    facts: dict[str, Any] = {"installed": True, "version": chk.get("torch"), "cuda": chk.get("cuda"),
                             "available": bool(chk.get("available"))}
    if "device_count" in chk:
        facts["device_count"] = chk["device_count"]
    return facts


def install_advice(python: str, driver_version: str | None, gpus: list[tuple[int, int]] | None = None) -> str:
    """The install line for the torch build this driver runs with kernels for these GPUs' compute capabilities
    (``doctor/wheels.py``), or that the driver must be upgraded first; without a known driver version, how to
    pick one."""
    if driver_version is None:
        return (f"`{python} -m pip install torch --index-url https://download.pytorch.org/whl/cuXYZ` with the "
                "cuXYZ your driver runs (docs/egpu.md, \"Which torch build fits the driver\")")
    choice = choose(driver_version, gpus or ())
    if choice is None:
        return no_build_why(driver_version, gpus or ())
    cc = f" with kernels for compute capability {_ccs(gpus)}" if gpus else ""
    return (f"`{choice.pip(python)}` (torch {choice.torch} for CUDA {choice.build.cuda[0]}.{choice.build.cuda[1]}, "
            f"the newest build driver {driver_version} runs{cc})")


def _ccs(gpus: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}.{b}" for a, b in sorted(set(gpus)))


def gpu_archs(nvml: NvmlFacts) -> list[tuple[int, int]]:
    """The compute capabilities NVML reported for the GPUs ([] where it did not say)."""
    out = []
    for g in nvml.gpus:
        cc = g.get("cuda_cc")
        if isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) for x in cc):
            out.append((cc[0], cc[1]))
    return out


def check_cuda(host: Host, nvml: NvmlFacts) -> list[Result]:
    out: list[Result] = []
    drv = nvml.system.get("cuda_driver_version") if nvml.ok else None
    dver = nvml.system.get("driver_version") if nvml.ok else None
    driver_version = str(dver) if dver else None
    archs = gpu_archs(nvml)
    if nvml.ok and drv is None:
        out.append(fail(
            G, "driver CUDA", "libcuda.so.1 not found: CUDA programs cannot run",
            "install the driver's CUDA library (Debian/Ubuntu: libnvidia-compute-NNN, same version as the driver)",
        ))  # fmt: skip
    elif drv is not None:
        out.append(ok(G, "driver CUDA", f"the driver supports CUDA up to {cuda_text(int(drv))}"))
    t = probe_torch(host)
    if t.get("timed_out"):
        out.append(fail(
            G, "torch", f"torch.cuda did not answer within {host.deadline:g} s",
            "a GPU or the driver is wedged: see the driver checks above, `sudo dmesg`, then reset the GPU or reboot",
        ))  # fmt: skip
        return out
    if t.get("installed") is False:
        out.append(warn(
            G, "torch", f"torch is not installed for {host.python}: CUDA/driver compatibility cannot be checked, "
            "and the health probes cannot run with it",
            f"{install_advice(host.python, driver_version, archs)}; or point `doctor --python` / probes.python at the "
            "environment that trains",
        ))  # fmt: skip
        return out
    if t.get("installed") is None or t.get("error"):
        out.append(fail(G, "torch", f"torch failed: {t.get('error')}", "run `python -c 'import torch'` to see why"))
        return out
    built = t.get("cuda")
    if built is None:
        out.append(warn(
            G, "torch build", f"torch {t.get('version')} is a CPU-only build: it will never use the GPU",
            f"install a CUDA build: {install_advice(host.python, driver_version, archs)}",
        ))  # fmt: skip
        return out
    need = _as_int(str(built))
    # Minor version compatibility: a build runs on any driver of its CUDA major's minimum, even one whose own CUDA
    # version is older (doctor/wheels.py); only below that minimum is it "CUDA driver version is insufficient".
    runs = runs_on(str(built), driver_version) if driver_version is not None else None
    newer = drv is not None and need is not None and need > int(drv)
    floor = FAMILY_MIN_DRIVER.get(need // 1000) if need is not None else None
    if runs is False or (runs is None and newer):
        upgrade = (f"upgrade the NVIDIA driver to >= {text(floor)} (the oldest that runs CUDA {built} builds)"
                   if floor is not None else f"upgrade the NVIDIA driver to one that supports CUDA {built}")
        which = f"driver {driver_version}" if driver_version is not None else "the driver"
        supports = f"only up to {cuda_text(int(drv))}" if drv is not None else "an older CUDA"
        out.append(fail(
            G, "torch build", f"torch {t.get('version')} is built for CUDA {built}, but the driver supports "
            f"{supports} ({which}: \"CUDA driver version is insufficient\")",
            f"{upgrade}, or install the build this driver runs: {install_advice(host.python, driver_version, archs)}",
        ))  # fmt: skip
        return out
    compat = ""
    if runs and newer and drv is not None and floor is not None:
        compat = (f" (newer than the driver's CUDA {cuda_text(int(drv))}: it runs under CUDA minor version "
                  f"compatibility, driver {driver_version} >= {text(floor)})")
    out.append(ok(G, "torch build", f"torch {t.get('version')} built for CUDA {built}{compat}"))
    if nvml.ok and not nvml.system.get("count"):
        out.append(ok(G, "torch.cuda", "no GPU for torch to use: NVML lists none (see the lines above)"))
        return out
    if not t.get("available"):
        out.append(fail(
            G, "torch.cuda", "torch.cuda.is_available() is False",
            "check the driver checks above and that CUDA_VISIBLE_DEVICES is not empty; run "
            "`python -c 'import torch; torch.cuda.init()'` for torch's own reason",
        ))  # fmt: skip
        return out
    out.append(ok(G, "torch.cuda", "torch.cuda.is_available() is True"))
    seen, count = int(t.get("device_count") or 0), int(nvml.system.get("count") or 0)
    if nvml.ok and seen < count:
        cvd = host.env.get("CUDA_VISIBLE_DEVICES")
        why = f"CUDA_VISIBLE_DEVICES={cvd!r} hides the others" if cvd is not None else "some are not usable by CUDA"
        out.append(warn(
            G, "torch devices", f"torch sees {seen} of the {count} GPUs NVML lists: {why}",
            "unset CUDA_VISIBLE_DEVICES (or list every GPU in it)" if cvd is not None
            else "check the per-GPU lines above (lost GPU, MIG mode)",
        ))  # fmt: skip
    else:
        out.append(ok(G, "torch devices", f"torch sees {seen} GPU(s), as NVML does"))
    return out
