"""Drain this host's Slurm node when a GPU's health takes it out of service; resume it when the GPUs recover, only
if gpuwatchd drained it and nobody changed it since (a person's drain is never undone). Rate-limited, idempotent
across restarts (the ledger), dry-run mode; every action is logged, counted and becomes a notification (the
``GpuwatchdNodeDrained`` alert fires while gpuwatchd holds a drain and resolves when it resumes the node)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwatchd.model import Alert
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.config import SlurmConfig
from gpuwatchd.remediation.counters import Counters
from gpuwatchd.remediation.ledger import Drain, Ledger
from gpuwatchd.remediation.policy import drain_reason, next_step, out_of_service
from gpuwatchd.remediation.scontrol import CallResult, NodeState, Scontrol

log = logging.getLogger(__name__)

SYSTEM = "slurm"
ALERT_DRAINED = "GpuwatchdNodeDrained"
ALERT_FAILED = "GpuwatchdRemediationFailed"


@dataclass(frozen=True, slots=True)
class _Failed:
    action: str
    message: str
    at: float


class SlurmRemediation:
    """One node's drain/resume. ``step`` is called after each rule evaluation with the GPUs' health."""

    def __init__(self, cfg: SlurmConfig, node: str, ledger: Ledger, counters: Counters, scontrol: Scontrol,
                 *, host: str) -> None:
        self.cfg = cfg
        self.node = node
        self.ledger = ledger
        self.counters = counters
        self.scontrol = scontrol
        self.host = host
        self._good_since: float | None = None
        self._left_alone = False  # this episode's node was already drained by someone else: said once
        self._failed: _Failed | None = None
        held = ledger.drain
        if held is not None and held.dry_run and not cfg.dry_run:
            # A drain that was only imagined (dry run) is not one to hold now that drains are real.
            log.info("remediation: dropping the dry-run drain of %s recorded before dry_run was turned off",
                     held.node)
            ledger.drain = None
            ledger.save()
        self._missing_logged = False
        self._rate_logged = False

    async def check(self) -> None:
        """At start: is Slurm reachable and the node known? One clear line either way (nothing changes)."""
        state, res = await self.scontrol.show(self.node)
        if self._called(res, "show") and state is not None:
            held = self.ledger.drain
            log.info("remediation: Slurm node %s is %s%s%s", self.node, state.state,
                     f" (reason: {state.reason})" if state.reason else "",
                     "; gpuwatchd holds its drain" if held is not None and not held.dry_run else "")

    def _called(self, res: CallResult, action: str) -> bool:
        """Count and log a failed scontrol call; True when it worked."""
        self.counters.up[SYSTEM] = res.ok
        if res.ok:
            if self._missing_logged:
                log.info("remediation: scontrol works again")
            self._missing_logged = False
            return True
        self.counters.error(SYSTEM, res.failure or "failed")
        if res.failure == "missing":
            if not self._missing_logged:  # one line, not one per evaluation
                log.error("remediation.slurm is enabled but Slurm is not usable here: %s; gpuwatchd will not drain "
                          "node %s (gpuwatchd_remediation_up{system=\"slurm\"} is 0)", res.message, self.node)
                self._missing_logged = True
        else:
            log.error("remediation: %s", res.message)
        return False

    async def step(self, health: Mapping[str, GpuHealth], names: Mapping[str, str], now: float) -> None:
        bad = out_of_service(health, self.cfg.drain_actions)
        held = self.ledger.drain
        recovered = not bad and held is not None and all(
            health.get(u) is not None and health[u].state == "healthy" for u in held.gpus)
        if not recovered:
            self._good_since = None  # resume_after counts from when every GPU of the drain is healthy again
        elif self._good_since is None:
            self._good_since = now
        if not bad:
            self._left_alone = False
        step = next_step(bad, health, held, self._good_since, self.ledger.last_action_at, now=now,
                         resume_after=self.cfg.resume_after, min_interval=self.cfg.min_interval)
        if step == "rate_limited":
            if not self._rate_logged:
                log.info("remediation: node %s: next action waits for remediation.slurm.min_interval (%g s)",
                         self.node, self.cfg.min_interval)
                self._rate_logged = True
            return
        self._rate_logged = False
        if step == "drain" and not self._left_alone:
            await self._drain(bad, names, now)
        elif step == "resume" and held is not None:
            await self._resume(held, now)

    async def _drain(self, bad: Mapping[str, GpuHealth], names: Mapping[str, str], now: float) -> None:
        reason = drain_reason(bad, names)
        gpus = tuple(bad)
        if self.cfg.dry_run:
            log.warning("remediation (dry run): would drain Slurm node %s: %s", self.node, reason)
            self._hold(Drain(self.node, reason, now, gpus, dry_run=True), now, "drain", "dry_run")
            return
        state, res = await self.scontrol.show(self.node)
        if not self._called(res, "show") or state is None:
            self._fail("drain", res.message, now)
            return
        if state.drained:
            # A person (or Slurm itself) took the node out already: theirs to put back, never ours.
            log.warning("remediation: %s wants node %s drained, but it is already %s (reason %r set by %s): leaving "
                        "it to whoever did that", ", ".join(names.get(u, u) for u in gpus), self.node, state.state,
                        state.reason, state.reason_user or "unknown")
            self.counters.action(SYSTEM, "drain", "skipped")
            self._left_alone = True
            return
        res = await self.scontrol.drain(self.node, reason)
        if not self._called(res, "drain"):
            self._fail("drain", res.message, now)
            return
        log.warning("remediation: drained Slurm node %s: %s", self.node, reason)
        self._hold(Drain(self.node, reason, now, gpus), now, "drain", "ok")

    async def _resume(self, held: Drain, now: float) -> None:
        if held.dry_run or self.cfg.dry_run:
            log.warning("remediation (dry run): would resume Slurm node %s (the GPUs are healthy again)", self.node)
            self._release(now, "dry_run")
            return
        state, res = await self.scontrol.show(held.node)
        if not self._called(res, "show"):
            self._fail("resume", res.message, now)
            return
        if state is None or not self._still_ours(state, held):
            now_is = "gone from Slurm" if state is None else (
                f"{state.state}, reason {state.reason!r} set by {state.reason_user or 'unknown'}")
            log.warning("remediation: the GPUs of node %s are healthy again, but its drain was changed since "
                        "gpuwatchd set it (now %s): not resuming it", held.node, now_is)
            self._release(now, "skipped", acted=False)
            return
        res = await self.scontrol.resume(held.node)
        if not self._called(res, "resume"):
            self._fail("resume", res.message, now)
            return
        log.warning("remediation: resumed Slurm node %s: its GPUs are healthy again (drained at %s for: %s)",
                    held.node, _when(held.at), held.reason)
        self._release(now, "ok")

    @staticmethod
    def _still_ours(state: NodeState, held: Drain) -> bool:
        return state.drained and state.reason == held.reason and "DOWN" not in state.state.upper()

    def _hold(self, drain: Drain, now: float, action: str, result: str) -> None:
        self.ledger.drain = drain
        self.ledger.last_action_at = now
        self.ledger.save()
        self._failed = None
        self.counters.action(SYSTEM, action, result)

    def _release(self, now: float, result: str, *, acted: bool = True) -> None:
        self.ledger.drain = None
        if acted:
            self.ledger.last_action_at = now
        self.ledger.save()
        self._failed = None
        self._good_since = None
        self.counters.action(SYSTEM, "resume", result)

    def _fail(self, action: str, message: str, now: float) -> None:
        self.counters.action(SYSTEM, action, "failed")
        self.ledger.last_action_at = now  # a failed attempt waits min_interval too: no storm against a sick controller
        self.ledger.save()
        self._failed = _Failed(action, message, now)

    def alerts(self) -> list[Alert]:
        """The notifications of what remediation did: a drain held (resolving on resume), a failed action."""
        out = []
        held = self.ledger.drain
        base = {"host": self.host, "node": self.node, "system": SYSTEM}
        if held is not None:
            dry = " (dry run: not drained)" if held.dry_run else ""
            out.append(Alert(
                name=ALERT_DRAINED, severity="warning",
                labels={"alertname": ALERT_DRAINED, "severity": "warning", **base},
                summary=f"Slurm node {held.node} {'would be ' if held.dry_run else ''}drained by gpuwatchd{dry}: "
                        f"{held.reason.removeprefix('gpuwatchd: ')}",
                description=(f"No new jobs start on {held.node} until its GPUs are healthy again for "
                             f"{self.cfg.resume_after:g} s; then gpuwatchd resumes it (unless someone changed the "
                             f"drain since). To put it back by hand: scontrol update nodename={held.node} "
                             "state=resume"),
                state="firing", active_at=held.at, fired_at=held.at,
            ))
        if self._failed is not None:
            f = self._failed
            out.append(Alert(
                name=ALERT_FAILED, severity="warning",
                labels={"alertname": ALERT_FAILED, "severity": "warning", **base},
                summary=f"gpuwatchd could not {f.action} Slurm node {self.node}",
                description=f"{f.message[:500]}. It tries again after remediation.slurm.min_interval "
                            f"({self.cfg.min_interval:g} s).",
                state="firing", active_at=f.at, fired_at=f.at,
            ))
        return out


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
