"""The daemon's remediation: after each rule evaluation it reads the GPUs' health from the store (read only, as
the rules and the notifier do), keeps the escalation history, and drives the configured actions (Slurm drain and
resume). Its notifications are alerts the daemon hands to the dispatcher with the rules' own."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwatchd.model import Alert
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation import escalation
from gpuwatchd.remediation.config import RemediationConfig
from gpuwatchd.remediation.counters import Counters, RemediationCollector
from gpuwatchd.remediation.ledger import MAX_ACKS, Ack, Ledger
from gpuwatchd.remediation.nvsentinel import NvsentinelSender
from gpuwatchd.remediation.scontrol import Scontrol
from gpuwatchd.remediation.slurm import SYSTEM as SLURM
from gpuwatchd.remediation.slurm import SlurmRemediation
from gpuwatchd.runtime.clock import Clock
from gpuwatchd.runtime.waits import wait_event
from gpuwatchd.store import Store

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
ALERT_ESCALATED = "GpuHealthEscalated"
TICK_SECONDS = 5.0  # without an evaluation (a hung worker), remediation still looks this often
ACK_KINDS = ("inspected", "replaced")
MAX_COMMENT_CHARS = 500


def read_boot_id(path: Path = BOOT_ID) -> str | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return text[:64] or None


def default_node_name() -> str:
    """slurmd's default NodeName: the short host name."""
    return socket.gethostname().split(".", 1)[0]


class AckError(ValueError):
    pass


class Remediation:
    def __init__(self, cfg: RemediationConfig, store: Store, clock: Clock, state_dir: Path, *, host: str,
                 boot_id: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.host = host
        self.boot_id = boot_id if boot_id is not None else read_boot_id()
        self.counters = Counters()
        self.ledger = Ledger(cfg.state_path(state_dir))
        self.ledger.load()
        self.slurm: SlurmRemediation | None = None
        if cfg.slurm.enabled:
            node = cfg.slurm.node_name or default_node_name()
            scontrol = Scontrol(cfg.slurm.scontrol, cfg.slurm.slurm_conf, cfg.slurm.timeout,
                                env=os.environ if env is None else env)
            self.slurm = SlurmRemediation(cfg.slurm, node, self.ledger, self.counters, scontrol, host=host)
        self.nvsentinel: NvsentinelSender | None = None
        if cfg.nvsentinel.enabled:
            self.nvsentinel = NvsentinelSender(cfg.nvsentinel, self.counters, env=env)
        self._wake = asyncio.Event()
        self._states: dict[str, str] = {}  # uuid -> health state at the last look
        self._presence: dict[str, str] = {}  # uuid -> presence state at the last look
        self._lock = asyncio.Lock()

    def collector(self) -> RemediationCollector:
        def drained() -> dict[str, int]:
            d = self.ledger.drain
            if self.slurm is None:
                return {}
            node = d.node if d is not None else self.slurm.node
            return {f"{SLURM}\0{node}\0{str(d is not None and d.dry_run).lower()}": int(d is not None)}

        return RemediationCollector(self.counters, drained,
                                    lambda: {u: r.escalation for u, r in self.ledger.gpus.items()})

    def wake(self) -> None:
        """The rules just ran: look at the new health now."""
        self._wake.set()

    async def run(self) -> None:
        if self.slurm is not None:
            await self.slurm.check()
        while True:
            await wait_event(self._wake, TICK_SECONDS / self.clock.speed)
            self._wake.clear()
            await self.tick()

    def names(self) -> dict[str, str]:
        return {u: f"GPU {p.identity.index}" for u, p in self.store.presence.items()}

    async def tick(self) -> None:
        async with self._lock:
            now = self.clock.now()
            health = dict(self.store.health)
            self.observe(health, now)
            if self.slurm is not None:
                await self.slurm.step(health, self.names(), now)
            if self.nvsentinel is not None:
                names = self.names()
                ids = {u: (p.identity.index, p.identity.serial) for u, p in self.store.presence.items()}
                escalated = {u: escalation.summary(names.get(u, u), r) for u, r in self.ledger.gpus.items()
                             if r.escalation > 0}
                await self.nvsentinel.step(health, ids, escalated, now)

    def observe(self, health: Mapping[str, GpuHealth], now: float) -> None:
        """Escalation bookkeeping: GPU resets seen (a GPU back after leaving), failures as they start."""
        changed = False
        for uuid, pres in self.store.presence.items():
            before = self._presence.get(uuid)
            self._presence[uuid] = pres.state
            if before in ("lost", "removed") and pres.state == "present":
                rec = self.ledger.record(uuid)
                if rec.resets_boot != self.boot_id:
                    rec.resets, rec.resets_boot = 0, self.boot_id
                rec.resets += 1
                changed = True
        for uuid, h in health.items():
            before = self._states.get(uuid)
            self._states[uuid] = h.state
            if h.state != "unhealthy" or before == "unhealthy":
                continue
            rec = self.ledger.record(uuid)
            resets = rec.resets if rec.resets_boot == self.boot_id else 0
            if escalation.on_failure(rec, h, self.boot_id, resets, now):
                self.counters.escalations += 1
                log.warning("health escalation: %s; next: %s", escalation.summary(self.names().get(uuid, uuid), rec),
                            escalation.next_steps(rec.escalation))
            changed = True
        if changed:
            self.ledger.save()

    def alerts(self) -> list[Alert]:
        out = self.slurm.alerts() if self.slurm is not None else []
        names = self.names()
        for uuid, rec in sorted(self.ledger.gpus.items()):
            if rec.escalation <= 0:
                continue
            pres = self.store.presence.get(uuid)
            name = names.get(uuid, uuid)
            labels = {"alertname": ALERT_ESCALATED, "severity": "critical", "uuid": uuid, "host": self.host}
            if pres is not None:
                labels["gpu"] = str(pres.identity.index)
                if pres.identity.name:
                    labels["model"] = pres.identity.name
            at = rec.escalated_at or 0.0
            out.append(Alert(
                name=ALERT_ESCALATED, severity="critical", labels=labels,
                summary=escalation.summary(name, rec),
                description=f"Next: {escalation.next_steps(rec.escalation)}. Failures recorded: "
                            + "; ".join(f"{f.action} ({f.reason[:120]})" for f in rec.failures[-3:]),
                state="firing", active_at=at, fired_at=at, value=float(rec.escalation),
            ))
        return out

    def resolve_gpu(self, wanted: str) -> str:
        """A GPU by UUID or index, among those seen (present or not) or with a history."""
        for uuid, pres in self.store.presence.items():
            if wanted == uuid or (wanted.isascii() and wanted.isdigit() and int(wanted) == pres.identity.index):
                return uuid
        if wanted in self.ledger.gpus:
            return wanted
        known = ", ".join(f"{p.identity.index} ({u})" for u, p in sorted(self.store.presence.items())) or "none"
        raise AckError(f"no GPU {wanted[:96]!r} (known: {known})")

    def ack(self, gpu: str, kind: str, comment: str, by: str) -> dict[str, Any]:
        """An operator marks a GPU inspected or replaced: its escalation and failure history start over."""
        if kind not in ACK_KINDS:
            raise AckError(f"kind: expected one of {', '.join(ACK_KINDS)}, got {kind[:40]!r}")
        uuid = self.resolve_gpu(gpu)
        now = self.clock.now()
        rec = self.ledger.gpus.pop(uuid, None)
        previous = rec.escalation if rec is not None else 0
        clean = " ".join("".join(c if c.isprintable() else " " for c in comment).split())[:MAX_COMMENT_CHARS]
        ack = Ack(uuid, now, kind, clean, by[:100])
        self.ledger.acks.append(ack)
        del self.ledger.acks[:-MAX_ACKS]
        self.ledger.save()
        self._states.pop(uuid, None)
        self.counters.acks[kind] = self.counters.acks.get(kind, 0) + 1
        log.warning("health ack: %s marked %s by %s%s (escalation %d and %d failures cleared)", uuid, kind, ack.by,
                    f": {clean}" if clean else "", previous, len(rec.failures) if rec is not None else 0)
        return {"uuid": uuid, "kind": kind, "comment": clean, "by": ack.by, "at": now,
                "cleared": {"escalation": previous, "failures": len(rec.failures) if rec is not None else 0}}
