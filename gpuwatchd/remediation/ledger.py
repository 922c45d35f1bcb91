"""What remediation decided, kept in ``state_dir`` (``remediation.json``) so a restart neither drains twice nor
forgets that a drain is gpuwatchd's to undo: the drain gpuwatchd holds, when it last acted, each GPU's failure
history for escalation, and the operators' acknowledgements. Written atomically after every change; a file that
cannot be used is moved aside (``state_files.py``) and the daemon starts with an empty ledger."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuwatchd.state_files import StateFileError, read_json, set_aside

log = logging.getLogger(__name__)

VERSION = 1
MAX_ACKS = 200  # acknowledgements kept (the newest): a record, not an archive
MAX_FAILURES_PER_GPU = 20  # failure episodes kept per GPU for escalation (the newest)
MAX_GPUS = 256  # GPUs with a history (more than a host has)


@dataclass(frozen=True, slots=True)
class Drain:
    """A drain gpuwatchd set (or, in dry-run mode, would have set) and may undo."""

    node: str
    reason: str  # exactly as sent: a different reason on the node means someone changed it
    at: float
    gpus: tuple[str, ...]
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    """One unhealthy episode of a GPU: what it asked for and what the host looked like then."""

    at: float
    action: str  # the health action asked for (reset_gpu, reboot, ...)
    reason: str
    boot_id: str | None
    resets: int  # times gpuwatchd saw the GPU leave and come back in this boot (a reset) when it failed


@dataclass
class GpuRecord:
    failures: list[Failure] = field(default_factory=list)
    escalation: int = 0  # 0: none; 1: the action did not help (drain and inspect); 2+: replace the GPU
    escalated_at: float | None = None
    escalated_after: str | None = None  # the action that did not help
    resets: int = 0  # times the GPU left and came back (a reset) in boot ``resets_boot``
    resets_boot: str | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    uuid: str
    at: float
    kind: str  # inspected | replaced
    comment: str
    by: str


class Ledger:
    def __init__(self, path: Path | None, on_set_aside: Callable[[], None] | None = None) -> None:
        self.path = path
        self.drain: Drain | None = None
        self.last_action_at: float | None = None
        self.gpus: dict[str, GpuRecord] = {}
        self.acks: list[Ack] = []
        self._on_set_aside = on_set_aside

    def load(self) -> None:
        if self.path is None:
            return
        try:
            data = read_json(self.path)
            if data is None:
                return
            self._from(data)
        except (StateFileError, ValueError, TypeError, KeyError) as e:
            aside = set_aside(self.path)
            log.warning("remediation state %s unusable (%s); %s; starting with no drain held and no history",
                        self.path, e, f"moved to {aside}" if aside else "could not move it aside")
            self.drain, self.last_action_at, self.gpus, self.acks = None, None, {}, []
            if self._on_set_aside is not None:
                self._on_set_aside()

    def _from(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version-{VERSION} remediation file")
        d = data.get("drain")
        self.drain = None if d is None else Drain(str(d["node"]), str(d["reason"]), float(d["at"]),
                                                  tuple(str(g) for g in d["gpus"]), bool(d.get("dry_run", False)))
        last = data.get("last_action_at")
        self.last_action_at = None if last is None else float(last)
        gpus: dict[str, GpuRecord] = {}
        for uuid, rec in dict(data.get("gpus", {})).items():
            failures = [Failure(float(f["at"]), str(f["action"]), str(f["reason"]),
                                None if f.get("boot_id") is None else str(f["boot_id"]), int(f.get("resets", 0)))
                        for f in rec.get("failures", [])][-MAX_FAILURES_PER_GPU:]
            at = rec.get("escalated_at")
            after, boot = rec.get("escalated_after"), rec.get("resets_boot")
            gpus[str(uuid)] = GpuRecord(failures, int(rec.get("escalation", 0)), None if at is None else float(at),
                                        None if after is None else str(after), int(rec.get("resets", 0)),
                                        None if boot is None else str(boot))
        self.gpus = dict(list(gpus.items())[-MAX_GPUS:])
        self.acks = [Ack(str(a["uuid"]), float(a["at"]), str(a["kind"]), str(a["comment"]), str(a["by"]))
                     for a in data.get("acks", [])][-MAX_ACKS:]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "drain": None if self.drain is None else {**asdict(self.drain), "gpus": list(self.drain.gpus)},
            "last_action_at": self.last_action_at,
            "gpus": {u: {"failures": [asdict(f) for f in r.failures], "escalation": r.escalation,
                         "escalated_at": r.escalated_at, "escalated_after": r.escalated_after,
                         "resets": r.resets, "resets_boot": r.resets_boot}
                     for u, r in self.gpus.items()},
            "acks": [asdict(a) for a in self.acks],
        }

    def record(self, uuid: str) -> GpuRecord:
        rec = self.gpus.get(uuid)
        if rec is None:
            rec = self.gpus[uuid] = GpuRecord()
            while len(self.gpus) > MAX_GPUS:
                del self.gpus[next(iter(self.gpus))]
        return rec

    def save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.as_dict(), f, sort_keys=True, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot save remediation state to %s: %s (kept in memory; a restart forgets it)",
                        self.path, e.strerror or e)
