"""systemd readiness and watchdog notifications (``sd_notify`` protocol), in pure Python.

Why not the ``sdnotify`` PyPI package: it connects once at construction and swallows every error (so a test cannot
see what was sent), and it has been unmaintained since 2017; the protocol is one datagram per message
(``systemd/systemd:man/notify-selfcontained-example.py``), so a dozen lines here are simpler than a dependency.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


def _address(value: str) -> str | None:
    # Only "/path" and "@abstract" are unix sockets; newer systemd may pass "vsock:..." which we do not speak.
    if not value or value[0] not in "/@":
        return None
    return "\0" + value[1:] if value[0] == "@" else value


class SdNotifier:
    """Sends ``KEY=VALUE`` lines to ``$NOTIFY_SOCKET``; does nothing when not started by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval = _watchdog_interval(env)
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram; ``False`` when there is no socket or the send failed (logged once)."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(lines).encode(), self.address)
        except OSError as e:
            # A notification that cannot be sent must not take the daemon down; systemd will act on the silence.
            if not self._warned:
                log.warning("cannot notify systemd at %s: %s", self.address.lstrip("\0"), e.strerror or e)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def reloading(self) -> bool:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1; older versions ignore the extra line.
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of ``WATCHDOG_USEC`` (sd_watchdog_enabled(3) advice), or None."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None  # the variables were meant for another process (e.g. inherited from a parent)
    return int(usec) / 2e6
