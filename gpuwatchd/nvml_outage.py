"""One log line when NVML becomes unavailable and one when it is back: not one per retry."""

from __future__ import annotations

import logging

from gpuwatchd.config import NvmlConfig
from gpuwatchd.model import Snapshot

# Logged under the daemon's name: this is the line operators look for in `journalctl -u gpuwatchd`.
log = logging.getLogger("gpuwatchd.daemon")

# Worker errors that mean "there is no NVIDIA driver on this host" rather than "the driver misbehaves".
NO_DRIVER_REASONS = frozenset({"library_not_found", "driver_not_loaded"})


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
            log.warning(
                "NVML unavailable (%s); serving metrics without GPU data; retrying every %gs at most",
                reason,
                nvml.restart_backoff_max,
            )


def no_driver_detail(reason: str, nvml: NvmlConfig) -> str:
    """Where the worker looked. The daemon never loads NVML itself, so it cannot quote a dlopen message."""
    if reason == "driver_not_loaded":
        return f"libnvidia-ml.so.1 found but the nvidia kernel module is not loaded: {reason}"
    where = f"not in {nvml.library_path}" if nvml.library_path is not None else "not on the library search path"
    return f"libnvidia-ml.so.1 {where}: {reason}"
