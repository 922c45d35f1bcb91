"""The driver: NVIDIA kernel module loaded and its version, nouveau (a conflict), libnvidia-ml.so.1 found and the
same version as the kernel module (the "Driver/library version mismatch" after an upgrade without a reboot)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwatchd.config.files import InputFileError, read_bytes_file
from gpuwatchd.doctor.context import Host
from gpuwatchd.doctor.nvml_probe import NvmlFacts
from gpuwatchd.doctor.report import Result, fail, ok

G = "driver"
# /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC
# 2024" (proprietary) or "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build ...".
_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")

REBOOT_FIX = (
    "the driver was upgraded (or reinstalled) without a reboot, so the loaded kernel module is the old one: reboot, "
    "or stop everything using the GPU and reload the modules: "
    "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`"
)


def kernel_module_version(host: Host) -> str | None:
    """The loaded nvidia.ko's version, from /proc/driver/nvidia/version or /sys/module/nvidia/version."""
    proc = _small_file(host.path("/proc/driver/nvidia/version"))
    m = _NVRM.search(proc) if proc is not None else None
    if m:
        return m.group(1)
    sys_version = _small_file(host.path("/sys/module/nvidia/version"))
    if sys_version is None:
        return None
    return sys_version.strip() or None


# /proc/driver/nvidia/version is two lines; more than this under --root is not the driver's file.
MAX_VERSION_FILE_BYTES = 64 << 10


def _small_file(path: Path) -> str | None:
    """The text of a small kernel file under the host's root, through the capped, non-blocking reader (a FIFO or
    /dev/zero placed there must not hang doctor); None when it cannot be read."""
    try:
        data = read_bytes_file(path, max_bytes=MAX_VERSION_FILE_BYTES)
    except InputFileError:
        return None
    return data.decode("utf-8", "replace")


def check_driver(host: Host, nvml: NvmlFacts) -> list[Result]:
    out: list[Result] = []
    kmod = kernel_module_version(host)
    if kmod is None:
        out.append(fail(
            G, "kernel module", "the NVIDIA kernel module is not loaded (no /proc/driver/nvidia/version)",
            "install the NVIDIA driver for this kernel (e.g. `sudo ubuntu-drivers install`) or load it with "
            "`sudo modprobe nvidia`; if modprobe refuses, check Secure Boot (`mokutil --sb-state`: the module must be "
            "signed or enrolled) and `sudo dmesg | grep -i nvrm`",
        ))  # fmt: skip
    else:
        out.append(ok(G, "kernel module", f"nvidia {kmod} loaded"))
    if host.path("/sys/module/nouveau").is_dir():
        out.append(fail(
            G, "nouveau", "the nouveau driver is loaded and holds the GPU, so NVIDIA's cannot",
            "blacklist it: `printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' | sudo tee "
            "/etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u` (dracut -f on Fedora), then reboot",
        ))  # fmt: skip
    else:
        out.append(ok(G, "nouveau", "not loaded"))
    out.append(_library(nvml, kmod))
    return out


def _library(nvml: NvmlFacts, kmod: str | None) -> Result:
    name = "libnvidia-ml.so.1"
    if nvml.timed_out:
        where = f" (GPU {nvml.hung_gpu} stopped answering)" if nvml.hung_gpu is not None else ""
        return fail(
            G, name, f"NVML did not answer within the deadline{where}",
            "a GPU or the driver is wedged: look for Xid 79/119/62 in `sudo dmesg`; reset that GPU when idle "
            "(`sudo nvidia-smi -r -i N`) or reboot",
        )  # fmt: skip
    if nvml.error is not None:
        return fail(G, name, nvml.error,
                    "run `python -m gpuwatchd.sources.nvml.worker.doctor` to see the error in full")
    if nvml.init == "library_not_found":
        return fail(
            G, name, "not found by the dynamic loader",
            "install the driver's user-space libraries matching the kernel module (Debian/Ubuntu: "
            f"`libnvidia-compute-{(kmod or 'NNN').split('.')[0]}`), or set nvml.library_path in the config",
        )  # fmt: skip
    if nvml.init == "lib_rm_version_mismatch":
        return fail(
            G, name, f"Driver/library version mismatch: NVML init says '{nvml.init_message}' (kernel module "
            f"{kmod or 'unknown'})", REBOOT_FIX,
        )  # fmt: skip
    if nvml.init != "ok":
        return fail(
            G, name, f"NVML init failed: {nvml.init} ({nvml.init_message})",
            "check `sudo dmesg | grep -i nvrm` for why the driver refused; `nvidia-smi` shows the same error",
        )  # fmt: skip
    lib = nvml.system.get("driver_version")
    if kmod is not None and lib is not None and lib != kmod:
        return fail(G, name, f"Driver/library version mismatch: library {lib}, kernel module {kmod}", REBOOT_FIX)
    return ok(G, name, f"found, driver {lib or 'unknown'} (same as the kernel module)")
