"""One log line when NVML becomes unavailable and one when it is back: not one per retry."""

from __future__ import annotations

import logging

from gpuwatchd.config.loader import NvmlConfig
from gpuwatchd.model import Snapshot

# Logged under the daemon's name: this is the line operators look for in `journalctl -u gpuwatchd`.
log = logging.getLogger("gpuwatchd.daemon")

# Worker errors that mean "there is no NVIDIA driver on this host" rather than "the driver misbehaves".
NO_DRIVER_REASONS = frozenset({"library_not_found", "driver_not_loaded"})
# What an operator can do about init failures on a host that has a driver (nvml.h l.1530-1540 and the
# nvmlInit/nvmlDeviceGetCount docs describe the codes; a library/RM mismatch follows a package upgrade that
# replaced libnvidia-ml.so while the old kernel module stayed loaded).
REASON_HINTS: dict[str, str] = {
    "lib_rm_version_mismatch": "the NVIDIA library and kernel module differ, as after a driver upgrade without a "
    "reboot: reboot, or reload the nvidia kernel modules",
    "no_permission": "this user cannot open /dev/nvidia*: check the unit's DeviceAllow= and the user's groups",
    "insufficient_power": "a GPU's power cables are not connected",
    "irq_issue": "the kernel driver reports an interrupt problem: check the kernel log",
}


class NvmlOutageLog:
    """Remembers the NVML error being reported, so each outage (and each change of reason) is logged once."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def observe(self, snap: Snapshot, nvml: NvmlConfig) -> None:
        if snap.nvml_ok:
            if self.reason is not None:
                log.info("NVML is up: driver %s, %d GPU(s)", snap.driver_version or "unknown", len(snap.gpus))
            self.reason = None
            return
        reason = snap.nvml_error or "unknown"
        if reason == self.reason:
            return
        self.reason = reason
        if reason in NO_DRIVER_REASONS:
            log.warning(
                "no NVIDIA driver found (%s); serving metrics without GPU data; retrying every %gs at most. "
                "To try gpuwatchd without a GPU: gpuwatchd sim --scenario idle",
                no_driver_detail(reason, nvml),
                nvml.restart_backoff_max,
            )
        else:
            hint = REASON_HINTS.get(reason)
            log.warning(
                "NVML unavailable (%s%s); serving metrics without GPU data; retrying every %gs at most",
                reason,
                f": {hint}" if hint else "",
                nvml.restart_backoff_max,
            )


def no_driver_detail(reason: str, nvml: NvmlConfig) -> str:
    """Where the worker looked. The daemon never loads NVML itself, so it cannot quote a dlopen message."""
    if reason == "driver_not_loaded":
        return f"libnvidia-ml.so.1 found but the nvidia kernel module is not loaded: {reason}"
    where = f"not in {nvml.library_path}" if nvml.library_path is not None else "not on the library search path"
    return f"libnvidia-ml.so.1 {where}: {reason}"
