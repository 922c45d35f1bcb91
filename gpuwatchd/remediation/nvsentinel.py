"""Each GPU health change as an NVSentinel health event, sent to its platform connector over gRPC on a unix socket
(``PlatformConnector.HealthEventOccurredV1``; schema: ``nvsentinel_pb/health_event.proto``, our hand-written
wire-compatible subset of NVSentinel's). NVSentinel's own GPU monitor needs DCGM; this hands it gpuwatchd's verdict
instead (NVSentinel #756, #1031, #1036).

One event per change of a GPU's (state, action, evidence); a GPU that recovers gets a healthy event for each check
that had failed, so NVSentinel clears what it recorded. The state ``unknown`` (NVML down, GPU not answering yet) is
not sent: it says nothing either way. Undelivered events are retried (the latest per GPU), counted and logged once
per streak; an absent socket is one log line and a metric.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatchd.model.health import ACTION_TEXT, GpuHealth, HealthAction
from gpuwatchd.remediation.config import NvsentinelConfig
from gpuwatchd.remediation.counters import Counters

log = logging.getLogger(__name__)

SYSTEM = "nvsentinel"
AGENT = "gpuwatchd"
COMPONENT_CLASS = "GPU"
EVENT_VERSION = 1
HEALTH_CHECK = "GpuHealth"  # the check name when no alert names the evidence (a probe's own verdict)
MAX_MESSAGE_CHARS = 1024

# gpuwatchd's health action (derived from NVIDIA's Xid catalog buckets, gpu/health.py) -> NVSentinel's
# RecommendedAction: RESET_GPU -> COMPONENT_RESET, RESTART_BM -> RESTART_BM, RESTART_APP -> RESTART_APP; hardware to
# inspect (CHECK_MECHANICALS, repeated fatal Xids) -> CONTACT_SUPPORT. An eGPU's cable is not NVSentinel's to act on.
RECOMMENDED: dict[HealthAction, str] = {
    "none": "NONE",
    "restart_app": "RESTART_APP",
    "reset_gpu": "COMPONENT_RESET",
    "reboot": "RESTART_BM",
    "inspect_hardware": "CONTACT_SUPPORT",
    "check_cable": "UNKNOWN",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One health event, as plain data (the proto message is built from it where grpc is loaded)."""

    uuid: str
    check: str
    healthy: bool
    fatal: bool
    message: str
    action: str  # RecommendedAction name
    entities: tuple[tuple[str, str], ...]
    metadata: tuple[tuple[str, str], ...]
    at: float


def node_name(cfg: NvsentinelConfig, env: Mapping[str, str]) -> str:
    return cfg.node_name or env.get("NODE_NAME") or socket.gethostname().split(".", 1)[0]


def events_for(uuid: str, h: GpuHealth, before: tuple[str, ...], *, index: int | None, serial: str | None,
               escalated: str | None, now: float) -> list[Event]:
    """The events one GPU's health change makes: its failing checks, and healthy ones for the checks ``before``
    (failing in NVSentinel) that no longer are."""
    entities = ((("GPU", str(index)),) if index is not None else ()) + (("GPU_UUID", uuid),)
    meta = {"uuid": uuid, "state": h.state, "action": h.action, "evidence": ",".join(h.evidence)}
    if serial:
        meta["SerialNumber"] = serial
    if h.state == "healthy":
        return [Event(uuid, check, True, False, f"{check}: healthy again ({h.reason})"[:MAX_MESSAGE_CHARS], "NONE",
                      entities, tuple(sorted(meta.items())), now) for check in before]
    action = RECOMMENDED[h.action]
    text = f"{h.reason}; to do: {ACTION_TEXT[h.action]}"
    if escalated:
        action = "CONTACT_SUPPORT"
        text = f"{escalated}; {text}"
        meta["escalated"] = escalated
    checks = h.evidence or (HEALTH_CHECK,)
    gone = [Event(uuid, check, True, False, f"{check}: no longer seen", "NONE", entities,
                  tuple(sorted(meta.items())), now) for check in before if check not in checks]
    return gone + [Event(uuid, check, False, h.state == "unhealthy", text[:MAX_MESSAGE_CHARS], action, entities,
                         tuple(sorted(meta.items())), now) for check in checks]


def send(sock: Path, events: list[Event], node: str, dry_run: bool, timeout: float) -> None:
    """One ``HealthEventOccurredV1`` call (blocking: run it in a thread); raises ``grpc.RpcError`` or OSError."""
    import grpc

    from gpuwatchd.remediation.nvsentinel_pb import health_event_pb2 as pb
    from gpuwatchd.remediation.nvsentinel_pb import health_event_pb2_grpc as pb_grpc

    msg = pb.HealthEvents(version=EVENT_VERSION)
    strategy = pb.STORE_ONLY if dry_run else pb.EXECUTE_REMEDIATION
    for e in events:
        event = pb.HealthEvent(
            version=EVENT_VERSION, agent=AGENT, componentClass=COMPONENT_CLASS, checkName=e.check,
            isFatal=e.fatal, isHealthy=e.healthy, message=e.message,
            recommendedAction=pb.RecommendedAction.Value(e.action),
            entitiesImpacted=[pb.Entity(entityType=t, entityValue=v) for t, v in e.entities],
            metadata=dict(e.metadata), nodeName=node, processingStrategy=strategy,
        )
        event.generatedTimestamp.FromNanoseconds(int(e.at * 1e9))
        msg.events.append(event)
    options = [("grpc.enable_retries", 0)]
    with grpc.insecure_channel(f"unix://{sock}", options=options) as channel:
        stub = pb_grpc.PlatformConnectorStub(channel)  # type: ignore[no-untyped-call]
        stub.HealthEventOccurredV1(msg, timeout=timeout)


@dataclass
class _Gpu:
    sent: tuple[str, str, tuple[str, ...]] | None = None  # (state, action, evidence) NVSentinel has
    failing: tuple[str, ...] = ()  # checks NVSentinel holds as failing for this GPU
    pending: list[Event] = field(default_factory=list)
    key: tuple[str, str, tuple[str, ...]] | None = None  # what ``pending`` says


class NvsentinelSender:
    def __init__(self, cfg: NvsentinelConfig, counters: Counters, env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.counters = counters
        self.node = node_name(cfg, os.environ if env is None else env)
        self._gpus: dict[str, _Gpu] = {}
        self._last_try: float | None = None
        self._failing_logged = False

    async def step(self, health: Mapping[str, GpuHealth], ids: Mapping[str, tuple[int, str | None]],
                   escalated: Mapping[str, str], now: float) -> None:
        for uuid, h in sorted(health.items()):
            if h.state == "unknown":
                continue
            g = self._gpus.setdefault(uuid, _Gpu())
            key = (h.state, h.action, h.evidence)
            if key in (g.sent, g.key):
                continue
            index, serial = ids.get(uuid, (None, None))
            if h.state == "healthy" and g.sent is None and not g.failing:
                before: tuple[str, ...] = (HEALTH_CHECK,)  # first word about this GPU: say it is healthy
            else:
                before = g.failing
            g.pending = events_for(uuid, h, before, index=index, serial=serial, escalated=escalated.get(uuid), now=now)
            g.key = key
        due = [(u, g) for u, g in self._gpus.items() if g.key is not None]
        if not due:
            return
        if self._failing_logged and self._last_try is not None and now - self._last_try < self.cfg.retry_interval:
            return  # the connector is failing: the latest state goes at the next retry, not at every change
        self._last_try = now
        events = [e for _, g in due for e in g.pending]
        if events and not await self._send(events):
            return
        for _, g in due:
            assert g.key is not None
            g.sent, g.key = g.key, None
            g.failing = tuple(e.check for e in g.pending if not e.healthy)
            g.pending = []

    async def _send(self, events: list[Event]) -> bool:
        result = "dry_run" if self.cfg.dry_run else "ok"
        try:
            await asyncio.to_thread(send, self.cfg.socket, events, self.node, self.cfg.dry_run, self.cfg.timeout)
        except Exception as e:  # grpc.RpcError (its module is imported lazily), OSError
            if not isinstance(e, OSError) and type(e).__module__.split(".")[0] != "grpc":
                raise
            reason, detail = _why(e, self.cfg.socket)
            self.counters.up[SYSTEM] = False
            self.counters.error(SYSTEM, reason)
            for _ in events:
                self.counters.action(SYSTEM, "event", "failed")
            if not self._failing_logged:
                log.error("remediation.nvsentinel: cannot send health events to %s: %s; retrying every %g s "
                          "(gpuwatchd_remediation_up{system=\"nvsentinel\"} is 0)", self.cfg.socket, detail,
                          self.cfg.retry_interval)
                self._failing_logged = True
            return False
        if self._failing_logged:
            log.info("remediation.nvsentinel: health events reach %s again", self.cfg.socket)
        self._failing_logged = False
        self.counters.up[SYSTEM] = True
        for ev in events:
            self.counters.action(SYSTEM, "event", result)
            log.info("nvsentinel event: %s %s %s%s (%s)", ev.uuid, ev.check, "healthy" if ev.healthy else "unhealthy",
                     " fatal" if ev.fatal else "", ev.action)
        return True


def _why(e: BaseException, sock: Path) -> tuple[str, str]:
    code: Any = getattr(e, "code", None)
    name = getattr(code(), "name", "") if callable(code) else ""
    if not sock.exists():
        return "missing", f"no socket at {sock} (is NVSentinel's platform connector running on this node?)"
    if name == "DEADLINE_EXCEEDED":
        return "timeout", "the platform connector did not answer in time"
    details = getattr(e, "details", None)
    text = details() if callable(details) else str(e)
    return "failed", f"{name or type(e).__name__}: {str(text)[:300]}"
