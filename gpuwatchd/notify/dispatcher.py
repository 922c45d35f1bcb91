"""The dispatcher: Alertmanager's grouping and timing in front of a durable outbox.

``update(alerts)`` (every rule evaluation) sorts firing and resolved alerts into aggregation groups keyed by route
and ``group_by`` values. A group is flushed ``group_wait`` after it appears, then every ``group_interval``; a flush
drops muted alerts (silences, inhibition), asks :func:`nflog.needs_update` whether the receiver must hear about
it, and if so renders the message and writes it to the outbox. Delivery workers (``delivery.py``) send it.
Alertmanager receivers bypass grouping: they get every firing alert re-posted every ``alertmanager_resend``, to
every member of a cluster (``urls``), each member through its own worker and outbox rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.registry import Collector

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import Member, NotifyConfig, ReceiverConfig
from gpuwatchd.notify.fingerprints import alert_fp
from gpuwatchd.notify.inhibition import Inhibitor
from gpuwatchd.notify.metrics import GaugeState, NotifyMetrics
from gpuwatchd.notify.nflog import needs_update
from gpuwatchd.notify.notification import Notification, sort_alerts
from gpuwatchd.notify.payload_cap import render_capped
from gpuwatchd.notify.routing import Route, group_key, group_labels, routes_for
from gpuwatchd.notify.silences import Silences
from gpuwatchd.notify.store import OutboxRow, StateStore
from gpuwatchd.notify.store.nflog import LogEntry
from gpuwatchd.runtime.clock import Clock, wall_mapper
from gpuwatchd.runtime.waits import MAX_NAP_SECONDS, nap

if TYPE_CHECKING:
    from gpuwatchd.notify.delivery import Worker
    from gpuwatchd.notify.integration import Integration

log = logging.getLogger(__name__)


def _integration(kind: str) -> Integration:
    """The integration of a receiver type. Imported at the first receiver: a daemon without receivers (the default)
    loads none of the integrations nor the delivery workers (tests/cli/test_imports.py)."""
    from gpuwatchd.notify.integrations import integration

    return integration(kind)


# stop(): how long an in-flight request may finish before it is cancelled (its row stays pending, re-sent later).
STOP_GRACE_SECONDS = 2.0
# Housekeeping of the database (finished rows, expired log entries), in clock seconds.
GC_INTERVAL_SECONDS = 3600.0
FINISHED_ROW_RETENTION_SECONDS = 7 * 86400.0
# Scheduler nap when no group is due: new alerts wake it anyway.
IDLE_NAP_SECONDS = 60.0
# Finished deliveries (delivered or given up) remembered per receiver for the status page and `status --watch`.
RECENT_DELIVERIES = 20


@dataclass
class Group:
    """One aggregation group (route x group label values) for one receiver."""

    route: Route
    key: str
    labels: dict[str, str]
    next_flush: float
    alerts: dict[str, Alert] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Muting:
    """Why an alert is not notified right now."""

    silenced_by: tuple[str, ...] = ()
    inhibited_by: tuple[str, ...] = ()

    @property
    def muted(self) -> bool:
        return bool(self.silenced_by or self.inhibited_by)


class Dispatcher:
    """Groups, dedups, mutes and queues notifications; owns the delivery workers. See module docstring."""

    def __init__(self, config: NotifyConfig, *, state_dir: Path, clock: Clock, host: str) -> None:
        self.config = config
        self.host = host
        self._clock = clock
        self.state = StateStore(state_dir)
        self.outbox = self.state.outbox
        self.silences = Silences(self.state.silences)
        self._metrics = NotifyMetrics(self._gauge_state)
        self._metrics.registry.register(self.state.collector())
        self._groups: dict[tuple[str, str], Group] = {}
        self._sent: dict[tuple[str, str], LogEntry] = self.outbox.effective_entries()
        self._depths: dict[str, int] = self.outbox.depths()
        self._alerts: dict[str, Alert] = {}  # latest firing/resolved alerts by fingerprint
        self._firing: list[Alert] = []
        self._inhibitor = Inhibitor((), config.inhibit_rules)
        self._muted_counts = (0, 0)
        self._am_next: dict[str, float] = {}
        self._am_sent: dict[str, frozenset[str]] = {}
        self._workers: dict[str, Worker] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._bg: set[asyncio.Task[None]] = set()
        self._scheduler: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._napping_until = -math.inf  # clock time the scheduler sleeps until (its next due group or push)
        self._session: aiohttp.ClientSession | None = None
        self._next_gc = clock.now()
        self._recent: dict[str, deque[dict[str, Any]]] = {}
        self._delivered_at: dict[str, float] = {}  # per receiver member: when a row of it was last delivered

    # -- lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the scheduler and one delivery worker per receiver member (undelivered rows from before resume)."""
        self._session = aiohttp.ClientSession()
        if not self.config.receivers:
            log.warning(
                "no notification receivers configured (notify.receivers): alerts go nowhere but the API "
                "(/api/v1/alerts) and gpuwatchd status; add one and test it with `gpuwatchd notify test` "
                "(docs/notifications.md)"
            )
        for rc in self.config.receivers:
            for m in rc.members:
                self._start_worker(rc, m)
        self._abandon_orphans()
        self._scheduler = asyncio.create_task(self._schedule(), name="notify-scheduler")

    async def stop(self) -> None:
        """Queue what is due, let in-flight requests finish briefly, close. Pending rows stay in the outbox.

        Groups still inside ``group_wait`` are not forced out: after a restart the rules report their alerts again
        and, being older than ``group_wait``, they flush at once.
        """
        if self._session is not None:
            self.flush_due()
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
            self._scheduler = None
        if self._bg:
            await asyncio.gather(*self._bg, return_exceptions=True)
        await self._stop_workers(list(self._workers))
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.state.close()

    def reconfigure(self, config: NotifyConfig) -> None:
        """Apply a new config: changed receivers get new workers, groups are rebuilt (dedup keeps them quiet)."""
        old = {rc.name: rc for rc in self.config.receivers}
        self.config = config
        self._wake.set()  # an idle scheduler naps long (_schedule): a new Alertmanager is pushed to at once
        changed = [n for n in old if n not in {rc.name for rc in config.receivers} or old[n] != config.receiver(n)]
        if self._session is not None:
            stopping = [k for k, w in self._workers.items() if w.rc.name in changed]
            for n in stopping:
                self._workers[n].stopping = True
                self._workers[n].wake.set()
            for w in self._workers.values():
                w.config = config
            task = asyncio.get_running_loop().create_task(self._restart_workers(stopping))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        self._groups.clear()
        self._am_next.clear()
        self.update(list(self._alerts.values()), _keep_missing=True)

    async def _restart_workers(self, names: list[str]) -> None:
        await self._stop_workers(names)
        for rc in self.config.receivers:
            for m in rc.members:
                if m.key not in self._workers:
                    self._start_worker(rc, m)
        self._abandon_orphans()

    def _start_worker(self, rc: ReceiverConfig, member: Member) -> None:
        from gpuwatchd.notify.delivery import Worker

        assert self._session is not None
        w = Worker(
            rc,
            self.config,
            outbox=self.outbox,
            clock=self._clock,
            metrics=self._metrics,
            session=self._session,
            on_change=self._row_changed,
            member=member,
        )
        self._workers[member.key] = w
        task = asyncio.create_task(w.run(), name=f"notify-{member.endpoint}")
        task.add_done_callback(self._worker_done)
        self._tasks[member.key] = task

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        # A crashed worker would silently stop a receiver's deliveries: say so loudly (rows stay pending).
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "delivery worker %s crashed; its notifications stay queued", task.get_name(), exc_info=task.exception()
            )

    async def _stop_workers(self, names: list[str]) -> None:
        for n in names:
            self._workers[n].stopping = True
            self._workers[n].wake.set()
        tasks = [self._tasks.pop(n) for n in names if n in self._tasks]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_SECONDS / max(1.0, self._clock.speed) + 0.5)
            for t in late:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        for n in names:
            self._workers.pop(n, None)

    def _abandon_orphans(self) -> None:
        """Rows queued for receivers (or cluster members) no longer configured can never be sent: fail them, loudly."""
        names = {m.key for rc in self.config.receivers for m in rc.members}
        now = self._clock.now()
        for name in [r for r in self.outbox.depths() if r not in names]:
            # One statement, whatever the count: 50k rows used to be read whole and failed one transaction each.
            n = self.outbox.fail_receiver(name, now, "receiver no longer configured")
            log.error("receiver %r is no longer configured: its %d undelivered notifications were dropped", name, n)
        self._depths = self.outbox.depths()

    # -- input ----------------------------------------------------------------------------------------------------
    def update(self, alerts: Sequence[Alert], *, _keep_missing: bool = False) -> None:
        """Take the rules engine's current alerts (pending ones are ignored); queues whatever is due now."""
        now = self._clock.now()
        current = {alert_fp(a): a for a in alerts if a.state != "pending"}
        if not _keep_missing:
            # An alert that was firing and vanished without a "resolved" (rule removed, engine restarted) is over.
            for fp, old in self._alerts.items():
                if fp not in current and old.state == "firing":
                    current[fp] = replace(old, state="resolved", resolved_at=now)
        self._alerts = current
        self._firing = [a for a in current.values() if a.state == "firing"]
        self._inhibitor = Inhibitor(self._firing, self.config.inhibit_rules)
        for a in current.values():
            for route in routes_for(a.labels, self.config):
                if not self._grouped(route.receiver):
                    continue  # pushed alert by alert (flush_due)
                self._place(a, route, now)
        self.flush_due()
        # What was due is flushed; the scheduler is woken only when something is now due before it planned to
        # wake (a new group, an earlier push). Waking it at every evaluation re-ran flush_due for nothing.
        if self._next_due(now) < self._napping_until:
            self._wake.set()

    def _grouped(self, name: str) -> bool:
        for rc in self.config.receivers:
            if rc.name == name:
                return _integration(rc.type).grouped
        return True

    def _place(self, a: Alert, route: Route, now: float) -> None:
        glabels = group_labels(a.labels, route.group_by)
        key = group_key(route, glabels)
        gid = (route.receiver, key)
        g = self._groups.get(gid)
        if a.state == "resolved":
            # A resolution is news only to a group that holds the alert or a receiver that was told it fired.
            entry = self._sent.get(gid)
            known = g is not None and alert_fp(a) in g.alerts
            if not known and (entry is None or alert_fp(a) not in entry.firing):
                return
        if g is None:
            start = a.fired_at if a.fired_at is not None else now
            # Alertmanager: an alert older than group_wait (e.g. after a restart) flushes its new group at once.
            due = now if start + route.group_wait < now else now + route.group_wait
            g = self._groups[gid] = Group(route, key, glabels, due)
        g.alerts[alert_fp(a)] = a

    # -- flushing -------------------------------------------------------------------------------------------------
    def flush_due(self) -> None:
        """Flush every group whose timer has run out, and push to Alertmanagers that are due. Synchronous."""
        now = self._clock.now()
        muted = inhibited = 0
        for a in self._firing:
            m = self.muting(a, now)
            inhibited += bool(m.inhibited_by)
            muted += bool(m.silenced_by)
        self._muted_counts = (muted, inhibited)
        for gid, g in list(self._groups.items()):
            if g.next_flush <= now:
                self._flush(gid, g, now)
                nxt = g.next_flush + g.route.group_interval
                g.next_flush = nxt if nxt > now else now + g.route.group_interval
                if not g.alerts:
                    del self._groups[gid]
        for rc in self.config.receivers:
            if not _integration(rc.type).grouped:
                self._push_alertmanager(rc, now)
        if now >= self._next_gc:
            self._next_gc = now + GC_INTERVAL_SECONDS
            self.outbox.gc(now, FINISHED_ROW_RETENTION_SECONDS)
            self.silences.listing(now)

    def muting(self, a: Alert, now: float) -> Muting:
        """Silences and inhibitions applying to ``a`` now."""
        sil: tuple[str, ...] = tuple(self.silences.muted_by(a.labels, now))
        inh = self._inhibitor.inhibited_by(a)
        return Muting(sil, (inh,) if inh else ())

    def _flush(self, gid: tuple[str, str], g: Group, now: float) -> None:
        rc = self.config.receiver(g.route.receiver)
        prev = self._sent.get(gid)
        told = prev.firing if prev is not None else frozenset()
        # A resolution is news only to a receiver that was told the alert fired: one muted (inhibited by a lost
        # GPU, silenced) or over within group_wait was never shown, and its "resolved" would come out of nowhere.
        alerts = [
            a
            for a in g.alerts.values()
            if not self.muting(a, now).muted and (a.state == "firing" or alert_fp(a) in told)
        ]
        firing = frozenset(alert_fp(a) for a in alerts if a.state == "firing")
        resolved = frozenset(alert_fp(a) for a in alerts if a.state == "resolved")
        # Everything muted: like Alertmanager's pipeline (no stage runs on an empty alert list), nothing is sent and
        # the log keeps what the receiver was told. Logging an empty firing set here would make the same alerts
        # "new" again the moment an inhibition or silence ends, and re-send them before repeat_interval.
        reason = (
            None
            if not alerts
            else needs_update(
                self._sent.get(gid),
                firing,
                resolved,
                send_resolved=rc.send_resolved,
                repeat_interval=g.route.repeat_interval,
                now=now,
            )
        )
        if reason is not None:
            shown = [a for a in alerts if a.state == "firing" or rc.send_resolved]
            expires = now + 2 * g.route.repeat_interval
            if not shown:
                # All resolved but the receiver does not want resolutions: log it so the firing set is forgotten.
                self.state.nflog.write(rc.name, g.key, firing=firing, resolved=resolved, now=now, expires=expires)
            else:
                n = Notification(
                    receiver=rc.name,
                    group_key=g.key,
                    group_labels=g.labels,
                    alerts=sort_alerts(shown),
                    host=self.host,
                    now=now,
                    reason=reason,
                    external_url=self.config.external_url,
                )
                integ = _integration(rc.type)
                payload = render_capped(n.alerts, lambda some: integ.render(replace(n, alerts=tuple(some))),
                                        f"{rc.endpoint}: {g.key}")  # fmt: skip
                if payload is None:  # not even one alert fits (logged): counted, and not tried again until a change
                    self._metrics.outcome(rc.name, rc.type, "failure", "too_large")
                else:
                    self.outbox.enqueue(rc.name, g.key, payload, firing=firing, resolved=resolved, now=now)
                    self._depths[rc.name] = self._depths.get(rc.name, 0) + 1
                    log.info("%s: queued %s for %s (%s)", rc.endpoint, n.status, g.key, reason)
                    if rc.name in self._workers:
                        self._workers[rc.name].wake.set()
            self._sent[gid] = LogEntry(firing, resolved, now)
        # Like Alertmanager, resolved alerts leave the group once a flush has considered them.
        for fp in [fp for fp, a in g.alerts.items() if a.state == "resolved"]:
            del g.alerts[fp]

    def _push_alertmanager(self, rc: ReceiverConfig, now: float) -> None:
        from gpuwatchd.notify import alertmanager

        alerts = []
        for a in self._alerts.values():
            if self.muting(a, now).muted or rc.name not in {r.receiver for r in routes_for(a.labels, self.config)}:
                continue
            if a.state == "resolved" and (a.resolved_at or now) < now - alertmanager.RESOLVED_RESEND_SECONDS:
                continue
            if a.state == "resolved" and not rc.send_resolved:
                continue
            alerts.append(a)
        state = frozenset(f"{alert_fp(a)}:{a.state}" for a in alerts)
        due = now >= self._am_next.get(rc.name, now)
        if not alerts or (not due and state == self._am_sent.get(rc.name)):
            return
        # Alertmanager judges startsAt/endsAt by its own clock: a sim running ahead of it is mapped onto the wall.
        payload = render_capped(sort_alerts(alerts), lambda some: alertmanager.payload(
            some, now, self.config.alertmanager_resend, self.config.external_url, wall_mapper(self._clock)),
            rc.name)  # fmt: skip
        if payload is None:
            return
        # Every member of a cluster gets every push, through its own row: a member that is down retries on its
        # own schedule while the others are posted to at once (Alertmanager's README, "High Availability").
        for m in rc.members:
            row = self.outbox.enqueue(m.key, "alertmanager", payload, firing=(), resolved=(), now=now)
            # Each push carries the full current state, so an older one still queued (outage) is pointless.
            self.outbox.supersede(m.key, row.id, now)
            if m.key in self._workers:
                self._workers[m.key].wake.set()
        self._depths = self.outbox.depths()
        self._am_sent[rc.name] = state
        self._am_next[rc.name] = now + self.config.alertmanager_resend

    def _row_changed(self, row: OutboxRow, status: str) -> None:
        self._depths[row.receiver] = max(0, self._depths.get(row.receiver, 0) - 1)
        if status == "delivered":
            self._delivered_at[row.receiver] = self._clock.now()
        w = self._workers.get(row.receiver)
        self._recent.setdefault(row.receiver, deque(maxlen=RECENT_DELIVERIES)).append({
            "time": self._clock.now(),
            "status": status,
            "group_key": row.group_key,
            "firing": len(row.firing),
            "resolved": len(row.resolved),
            "attempts": row.attempts + 1,
            "error": w.last_error if status == "failed" and w is not None else None,
        })
        gid = (row.receiver, row.group_key)
        if status == "failed" and row.group_key != "alertmanager":
            # Given up: dedup falls back to what was delivered, so the next group_interval tries again.
            entry = self.outbox.effective_entry(*gid)
            if entry is None:
                self._sent.pop(gid, None)
            else:
                self._sent[gid] = entry

    def _next_due(self, now: float) -> float:
        return min(
            [g.next_flush for g in self._groups.values()] + list(self._am_next.values()),
            default=now + IDLE_NAP_SECONDS,
        )

    async def _schedule(self) -> None:
        while True:
            self.flush_due()
            self._napping_until = due = self._next_due(self._clock.now())
            # Idle (no group, no Alertmanager push due): nothing can fall due by the clock alone, and whatever
            # makes something due wakes the scheduler (update, reconfigure, wake), so it naps until then rather
            # than waking every MAX_NAP_SECONDS (twice a second: 7 % of the daemon's event loop at 8x32). The
            # hourly outbox GC then runs at most IDLE_NAP_SECONDS late.
            idle = not self._groups and not self._am_next
            await nap(self._clock, due, self._wake, IDLE_NAP_SECONDS if idle else MAX_NAP_SECONDS)

    # -- views ----------------------------------------------------------------------------------------------------
    def _gauge_state(self) -> GaugeState:
        now = self._clock.now()
        return GaugeState(
            depths=dict(self._depths),
            silences=self.silences.counts(now),
            silenced=self._muted_counts[0],
            inhibited=self._muted_counts[1],
            groups=len(self._groups),
            receivers=len(self.config.receivers),
        )

    def collector(self) -> Collector:
        """Prometheus collector of the delivery self-metrics (reads memory only)."""
        return self._metrics.collector()

    def receivers_for(self, a: Alert) -> list[str]:
        """Receiver names an alert is routed to."""
        return [r.receiver for r in routes_for(a.labels, self.config)]

    def now(self) -> float:
        return self._clock.now()

    def wake(self) -> None:
        """Let the scheduler and workers re-check the clock now (tests moving a ManualClock)."""
        self._wake.set()
        for w in self._workers.values():
            w.wake.set()

    def receivers_status(self) -> list[dict[str, Any]]:
        """Per configured receiver: type, queued notifications, last error (redacted), recent deliveries (newest
        first). No URL: receivers are named, never described."""
        out = []
        for rc in self.config.receivers:
            w = self._workers.get(rc.name)
            out.append({
                "name": rc.name,
                "type": rc.type,
                "queued": self._depths.get(rc.name, 0),
                "last_error": w.last_error if w is not None else None,
                "recent": list(reversed(self._recent.get(rc.name, ()))),
                # Each URL of the receiver (an Alertmanager cluster has one per member), in `urls` order.
                "members": [self._member_status(i, m) for i, m in enumerate(rc.members)],
            })
        return out

    def _member_status(self, index: int, m: Member) -> dict[str, Any]:
        """One member's own delivery health: ``failing`` (its last attempt failed: ``last_error`` says how), ``up``
        (its last attempt was delivered) or ``unknown`` (nothing sent to it since the daemon started). Named by
        its key and its place in ``urls``, never by its URL."""
        w = self._workers.get(m.key)
        error = w.last_error if w is not None else None
        delivered = self._delivered_at.get(m.key)
        health = "failing" if error else "up" if delivered is not None else "unknown"
        return {"name": m.key, "index": index, "health": health, "last_error": error, "last_delivered": delivered,
                "queued": self._depths.get(m.key, 0)}

    def reserve_send(self, member: Member) -> float:
        """Spend a token of ``member``'s rate limit for a send outside the outbox (a receiver test): 0 when taken,
        else the seconds until one is free. The token is the delivery worker's own, so tests and notifications
        share the limit."""
        w = self._workers.get(member.key)
        return w.take_token(self._clock.now()) if w is not None else 0.0

    def last_errors(self) -> dict[str, str | None]:
        """Latest delivery error per receiver member (already redacted; cluster members are ``name#i``)."""
        return {n: w.last_error for n, w in self._workers.items()}
