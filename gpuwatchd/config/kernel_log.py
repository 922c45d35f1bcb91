"""The ``kernel_log`` config section: the kernel-log source (docs/kernel-log.md)."""

from __future__ import annotations

from pathlib import Path

from gpuwatchd.config.types import PositiveDuration, SafePath, Section

DEFAULT_PATH = Path("/dev/kmsg")
STATE_FILE_NAME = "kernel-log.json"


class KernelLogConfig(Section, frozen=True):
    """Xids, falls off the bus, AER errors and driver messages from the kernel ring buffer (applied at start; a
    reload that changes it says a restart is needed)."""

    # Read the kernel log at all. Off: Xids come from NVML events only, and no GpuLost before NVML notices.
    enabled: bool = True
    # The ring buffer device (`gpuwatchd sim --kernel-log` points it at a replay file). Under
    # kernel.dmesg_restrict=1 reading it needs CAP_SYSLOG, which the shipped systemd unit grants.
    path: SafePath = DEFAULT_PATH
    # Where the last record read is remembered across restarts (so nothing is alerted twice). Unset:
    # kernel-log.json in state_dir.
    state_file: SafePath | None = None
    # An Xid reported by both NVML events and the kernel log, for the same GPU and code, less than this apart is
    # counted once (one NVML poll, or a slow one, separates the two reports).
    dedup_window: PositiveDuration = 10.0

    def state_path(self, state_dir: Path) -> Path:
        return self.state_file if self.state_file is not None else state_dir / STATE_FILE_NAME
