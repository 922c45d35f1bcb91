"""The daemon's account of GPUs whose NVML calls block, read from the worker's snapshots.

The worker sets such a GPU aside itself (:mod:`gpuwatchd.sources.nvml.worker.stall_watch`) and keeps polling the
others; each snapshot lists it as lost with reason ``hang_suspected`` (its call has blocked for a moment: a guess, so
the store keeps it present and holds its last readings) or ``timeout`` (blocked past ``nvml.poll_timeout`` while the
worker ran and the other GPUs answered: evidence, so it is shown lost). One episode per GPU, from the first such
snapshot until the GPU answers again or is no longer enumerated at that index: an INFO line when it is set aside, one
WARNING if the hang is confirmed, one INFO at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuwatchd.model import Snapshot
from gpuwatchd.sources.nvml.protocol import HANG_SUSPECTED, HUNG

log = logging.getLogger("gpuwatchd.sources.nvml.supervisor")  # one logger for everything about the worker


@dataclass
class HangEpisode:
    """A GPU whose NVML calls block: from the first snapshot that set it aside until it answers again."""

    uuid: str | None
    started: float  # loop time of the first snapshot that set it aside (scenario time is derived)
    confirmed: bool = False  # reported with reason timeout (hung), not only suspected


class HangLog:
    """Hang episodes by GPU index. Times are event-loop (real) seconds; ``speed`` turns them into scenario ones."""

    def __init__(self) -> None:
        self.episodes: dict[int, HangEpisode] = {}

    def observe(self, snap: Snapshot, now: float, speed: float, stall_after: float, hang_after: float) -> None:
        """One successful snapshot: start, confirm or end episodes."""
        for lost in snap.lost:
            if lost.reason not in (HANG_SUSPECTED, HUNG):
                continue
            name = f"GPU {lost.index}{f' ({lost.uuid})' if lost.uuid else ''}"
            ep = self.episodes.get(lost.index)
            if ep is None or ep.uuid != lost.uuid:
                ep = self.episodes[lost.index] = HangEpisode(lost.uuid, now)
                log.info("%s: an NVML call has blocked for more than %.2fs; it is set aside (hang suspected) while "
                         "the other GPUs keep reporting", name, stall_after)
            if lost.reason == HUNG and not ep.confirmed:
                ep.confirmed = True
                log.warning("%s blocked an NVML call for more than %.1fs while the other GPUs answered: shown lost "
                            "(reason timeout); the other GPUs keep reporting, and it is polled again once the "
                            "call returns", name, hang_after)
        if not self.episodes:
            return
        hung = {x.index for x in snap.lost if x.reason in (HANG_SUSPECTED, HUNG)}
        answering = {g.index: g.uuid for g in snap.gpus if g.parent_uuid is None}
        other = {x.index: x.reason for x in snap.lost if x.index not in hung}
        for index, ep in list(self.episodes.items()):
            if index in hung:
                continue
            del self.episodes[index]
            if index in answering and (ep.uuid is None or answering[index] == ep.uuid):
                log.info("GPU %d (%s) answers NVML calls again after %.1fs%s", index, answering[index],
                         (now - ep.started) * speed, "" if ep.confirmed else " (it was only suspected)")
            else:
                now_what = f"reported lost ({other[index]})" if index in other else "no longer enumerated there"
                log.info("GPU %d%s that blocked NVML calls is %s", index, f" ({ep.uuid})" if ep.uuid else "",
                         now_what)
