"""Hung-GPU quarantine: GPUs whose NVML calls block are left out of the next workers and retried now and then.

Without it one wedged GPU would make every GPU's data stale for the whole hang. A quarantined GPU is passed to
the next worker as ``skip`` (reported lost with reason ``timeout``, never touched: with a hung driver even the UUID
lookup blocks) until its retry is due, ``restart_backoff_max`` after it was set aside.

Logging: a hang is one WARNING naming the GPU and how long it had not answered, repeats at DEBUG, and one INFO
when that GPU answers again (or is no longer enumerated at that index).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpuwatchd.model import Snapshot

log = logging.getLogger("gpuwatchd.sources.supervisor")  # one logger for everything about the worker


@dataclass
class HangEpisode:
    """A GPU whose NVML calls block: from the first missed deadline until it answers again."""

    uuid: str | None
    started: float  # loop time the GPU was last heard from before the hang (scenario time is derived)
    kills: int = 1


class Quarantine:
    """Set-aside GPUs by index, and the hang episode each belongs to. Times are event-loop (real) seconds."""

    def __init__(self) -> None:
        # index -> (identity {"uuid", "pci_bus_id"}, loop time set aside)
        self.entries: dict[int, tuple[dict[str, Any], float]] = {}
        self.skipping: set[int] = set()  # quarantined GPUs the running worker leaves alone
        self.hangs: dict[int, HangEpisode] = {}  # index -> the hang being reported (one WARNING per episode)

    def skip(self, now: float, retry_after: float) -> dict[str, dict[str, Any]]:
        """The ``skip`` option of the next worker: GPUs set aside less than ``retry_after`` ago."""
        self.entries = {i: q for i, q in self.entries.items() if now - q[1] < retry_after}
        self.skipping = set(self.entries)
        return {str(i): q[0] for i, q in self.entries.items()}

    def set_aside(self, index: int, uuid: str | None, pci_bus_id: str | None, now: float) -> None:
        self.entries[index] = ({"uuid": uuid, "pci_bus_id": pci_bus_id}, now)

    def due(self, now: float, retry_after: float) -> list[int]:
        """GPUs the running worker skips whose retry is due (reported once: the caller replaces the worker)."""
        if not self.skipping:
            return []
        due = sorted(i for i in self.skipping if now - self.entries.get(i, ({}, 0.0))[1] >= retry_after)
        if due:
            self.skipping = set()
        return due

    def hang(self, index: int, uuid: str | None, *, last_heard: float, now: float, speed: float, retry: float) -> None:
        """Log a missed deadline blamed on GPU ``index``: a WARNING for a new episode, DEBUG for a repeat."""
        ep = self.hangs.get(index)
        name = f"GPU {index}{f' ({uuid})' if uuid else ''}"
        if ep is not None and ep.uuid == uuid:
            ep.kills += 1
            log.debug("NVML data stale: %s still blocks NVML calls (%d workers killed, %.1fs since it answered)",
                      name, ep.kills, (now - ep.started) * speed)
            return
        self.hangs[index] = HangEpisode(uuid, last_heard)
        log.warning(
            "NVML data stale: timeout: %s blocked an NVML call for more than %.1fs; the worker was killed, the other "
            "GPUs keep reporting and %s is shown lost (reason timeout), retried every %gs",
            name, (now - last_heard) * speed, f"GPU {index}", retry,
        )

    def answered(self, snap: Snapshot, now: float, speed: float) -> None:
        """A good snapshot: end the episodes of GPUs that answer again or are no longer enumerated there."""
        if not self.hangs:
            return
        answering = {g.index: g.uuid for g in snap.gpus}
        listed = answering.keys() | {x.index for x in snap.lost}
        for index, ep in list(self.hangs.items()):
            if index in answering and (ep.uuid is None or answering[index] == ep.uuid):
                del self.hangs[index]
                log.info("GPU %d (%s) answers NVML calls again after %.1fs without an answer (%d worker(s) "
                         "killed)", index, answering[index], (now - ep.started) * speed, ep.kills)
            elif index not in listed or (index in answering and answering[index] != ep.uuid):
                del self.hangs[index]  # no longer enumerated there: nothing left to wait for
                log.info("GPU %d%s that blocked NVML calls is no longer enumerated at that index", index,
                         f" ({ep.uuid})" if ep.uuid else "")
