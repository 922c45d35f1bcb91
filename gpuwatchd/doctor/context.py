"""What doctor looks at: the host's roots (``/proc``, ``/sys``, ``/dev`` under one injectable prefix), which NVML
library, the daemon's config and URL, deadlines; and the facts the subprocess probes bring back (read once)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatchd.config.loader import Config
from gpuwatchd.doctor.defaults import DEFAULT_DEADLINE, SERVICE_USER
from gpuwatchd.runtime.daemon_client import DaemonClient

__all__ = ["DEFAULT_DEADLINE", "SERVICE_USER", "Host"]


@dataclass
class Host:
    """The host under examination. ``root`` prefixes /proc, /sys and /dev (``/`` on a real host; a fake tree for
    ``gpuwatchd sim`` hosts and tests)."""

    root: Path = Path("/")
    config: Config = field(default_factory=Config)
    config_path: Path | None = None
    config_error: str | None = None  # the config file did not load: this message
    url: str = "http://127.0.0.1:9945"
    # TLS trust and basic auth for the daemon's status API (runtime/daemon_client.py); None: plain HTTP, no auth
    client: DaemonClient | None = None
    deadline: float = DEFAULT_DEADLINE
    service_user: str = SERVICE_USER
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))  # of the probe subprocesses
    # A simulated host's torch (from its scenario) instead of running the installed one (docs/egpu.md).
    torch_facts: dict[str, Any] | None = None
    # A saved kernel log to read Xids from instead of the daemon's or the live ring's (``--kernel-log``).
    kernel_log: Path | None = None

    def path(self, absolute: str) -> Path:
        """``/proc/driver/nvidia/version`` under ``root``."""
        return self.root / absolute.lstrip("/")

    def library_env(self) -> dict[str, str]:
        """The probe's environment: ``nvml.library_path`` of the config first on the loader's path, as the daemon's
        worker gets it."""
        env = dict(self.env)
        lib = self.config.nvml.library_path
        if lib is not None:
            libdir = lib.parent if lib.name.startswith("libnvidia-ml.so") else lib
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libdir), env.get("LD_LIBRARY_PATH", "")) if p)
        return env
