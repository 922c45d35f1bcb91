"""Child process for the SIGKILL test: a dispatcher fed the same alerts every 100 ms, like the daemon after rules.

Usage: python durability_child.py STATE_DIR SINK_URL N. Runs until killed; prints "ready" once started.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import RealClock

FIRED_AT = 1_700_000_000.0  # fixed: the restarted child reports the very same alerts, as restored rules would


def alerts(n: int) -> list[Alert]:
    return [
        Alert(
            name="GpuXidError",
            severity="critical",
            labels={
                "alertname": "GpuXidError",
                "severity": "critical",
                "uuid": f"GPU-{i:03d}",
                "gpu": str(i),
                "host": "h",
            },
            summary=f"Xid 79 on GPU {i}",
            description="fallen off the bus",
            state="firing",
            active_at=FIRED_AT,
            fired_at=FIRED_AT,
        )
        for i in range(n)
    ]


def child_config(url: str) -> NotifyConfig:
    """One webhook receiver at ``url``, a group per GPU, no wait, fast retries (also used by store/disk_child.py)."""
    return validate(NotifyConfig,
        {
            "receivers": [{"name": "sink", "type": "webhook", "url": url, "rate_limit_per_minute": 6000}],
            "group_wait": "0s",
            "group_by": ["uuid"],
            "retry_initial": "0.05s",
            "retry_max": "0.2s",
        }
    )


async def main(state_dir: Path, url: str, n: int) -> None:
    d = Dispatcher(child_config(url), state_dir=state_dir, clock=RealClock(), host="h")
    await d.start()
    print("ready", flush=True)
    batch = alerts(n)
    while True:
        d.update(batch)
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
