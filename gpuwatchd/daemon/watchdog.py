"""The systemd watchdog: ``WATCHDOG=1`` from the event loop itself."""

from __future__ import annotations

import asyncio

from gpuwatchd.runtime.sdnotify import SdNotifier


async def watchdog_loop(sd: SdNotifier, interval: float) -> None:
    # Sent from the event loop itself: if the loop wedges, the pings stop and systemd restarts us. A hung NVML
    # call cannot wedge it (it is in the worker process), so a dead GPU does not cause restart loops.
    while True:
        sd.watchdog()
        await asyncio.sleep(interval)
