"""The alert state machine: conditions from the rule families + ``now`` -> alerts, like Prometheus' alerting rules.

inactive -> pending (condition raised; ``active_at``) -> firing (held at every evaluation for ``for:``, timed per
kind of evidence when a rule names it, ``Condition.evidence``; ``fired_at``) -> resolved (not held for
``keep_firing_for``; ``resolved_at``) -> gone after ``resolved_retention``.
A pending alert whose condition clears vanishes silently (Prometheus semantics). An alert is identified by the
fingerprint of its condition's identity labels (``Condition.labels``); ``active_at`` survives across evaluations.
A condition returning after resolution starts a new alert (new ``active_at``). Attribution
(``Condition.attribution``: the process' name and owner, which may arrive late or change) is never identity: the
alert's labels follow it while pending and are frozen when it fires; the family puts the current facts in its
annotations (issue 28: pod labels arriving after a leak fired made one leak two alerts and three messages).

A family that raises is logged and counted; its alerts keep their state (missing data is not "all clear") and
the other families still run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import gpuwatchd.rules.fabric as fabric_rule
import gpuwatchd.rules.nvlink as nvlink_rule
import gpuwatchd.rules.nvswitch as nvswitch_rule
import gpuwatchd.rules.recovery as recovery_rule
from gpuwatchd.model import Alert, AlertState, fingerprint
from gpuwatchd.rules import (
    advice,
    dead_process,
    dock,
    ecc,
    failing,
    leak,
    link,
    presence,
    probe,
    temperature,
    throttle,
    xid,
    xid_repeat,
)
from gpuwatchd.rules.condition import Condition, RuleView
from gpuwatchd.rules.config import RulesConfig, RuleSection
from gpuwatchd.rules.underutilized import conditions as underutilized_conditions

log = logging.getLogger(__name__)

Family = Callable[[RuleView, float, RulesConfig], list[Condition]]


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One rule family: its function and, per alertname it produces, the config section with its timings."""

    name: str
    evaluate: Family
    sections: dict[str, Callable[[RulesConfig], RuleSection]]
    # Minimum time between two runs of the family; in between, its last conditions stand (like a Prometheus rule
    # group's own evaluation interval). 0: every evaluation.
    interval: Callable[[RulesConfig], float] = lambda c: 0.0


FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec("leak", leak.conditions, {"GpuMemoryLeak": lambda c: c.leak}, lambda c: c.leak.interval),
    FamilySpec("throttle", throttle.conditions, {"GpuThrottled": lambda c: c.throttle}),
    FamilySpec("xid", xid.conditions, {"GpuXidError": lambda c: c.xid}),
    FamilySpec("xid_repeat", xid_repeat.conditions,
               {"GpuXidRepeated": lambda c: c.xid_repeat, "GpuXidSupportCase": lambda c: c.xid_repeat}),
    FamilySpec("ecc", ecc.conditions, {"GpuEccError": lambda c: c.ecc}),
    FamilySpec(
        "link",
        link.conditions,
        {"GpuPcieLinkDegraded": lambda c: c.link, "GpuPcieReplays": lambda c: c.replays},
    ),
    FamilySpec(
        "presence",
        presence.conditions,
        {"GpuLost": lambda c: c.presence, "GpuRemoved": lambda c: c.presence, "GpuCountLow": lambda c: c.count},
    ),
    FamilySpec("temperature", temperature.conditions, {"GpuTemperatureHigh": lambda c: c.temperature}),
    FamilySpec(
        "dock",
        dock.conditions,
        {"GpuDockUnauthorized": lambda c: c.dock_unauthorized, "GpuDockLinkDegraded": lambda c: c.dock_link},
    ),
    FamilySpec(
        "probe", probe.conditions, {"GpuProbeFailed": lambda c: c.probe, "GpuPerformanceDegraded": lambda c: c.probe}
    ),
    FamilySpec("nvlink", nvlink_rule.conditions, {"GpuNvlinkErrors": lambda c: c.nvlink}),
    FamilySpec("fabric", fabric_rule.conditions, {"GpuFabricNotReady": lambda c: c.fabric}),
    FamilySpec("nvswitch", nvswitch_rule.conditions, {"NvSwitchError": lambda c: c.nvswitch}),
    FamilySpec("recovery", recovery_rule.conditions, {"GpuRecoveryActionRequired": lambda c: c.recovery}),
    FamilySpec("underutilized", underutilized_conditions, {"GpuUnderutilized": lambda c: c.underutilized}),
    FamilySpec("dead_process", dead_process.conditions,
               {"GpuMemoryHeldByDeadProcess": lambda c: c.dead_process}, lambda c: c.dead_process.interval),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
# The engine's own family: a family that keeps raising (rules/failing.py).
FAILING = "rule_failing"


@dataclass(slots=True)
class _Tracked:
    """Engine-side state of one alert identity."""

    family: str
    alert: Alert
    last_held: float  # last evaluation at which the condition was raise/hold
    # Per kind of evidence (Condition.evidence), the first evaluation of this episode at which a condition of
    # that evidence could fire it (a raise, or a hold that may fire): its for: runs from there ...
    since: dict[str | None, float]
    # ... or from the start of the current unbroken run of such evaluations, of whatever kinds (a leak judged by
    # turns on a short window and from its onset raises at every evaluation). None: the last could not fire.
    run_since: float | None
    # The sort key of ``alerts()`` (active_at, name, fingerprint): fixed for the life of the identity.
    key: tuple[float, str, str]
    # The condition last applied to the alert by _advance (None: none since it resolved or the config changed),
    # and what that application timed the hold from (min of ``since`` of its evidence and ``run_since``; None: it
    # could not fire) and for how long. Applying the same condition object again changes nothing but
    # ``last_held`` unless a pending alert's hold is over: the fast path of _advance.
    applied: Condition | None = None
    fire_from: float | None = None
    hold_for: float = 0.0
    # The identity labels (the condition's, with alertname/severity/host): the alert's labels less its attribution.
    ident: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FamilyStats:
    """Self-metrics of one family."""

    duration_seconds: float = 0.0
    failures: int = 0
    last_error: str | None = None


class RulesEngine:
    """Evaluates the built-in rules against a store. Not thread-safe: owned by the daemon's event loop."""

    def __init__(self, config: RulesConfig, *, host: str, families: tuple[FamilySpec, ...] = FAMILIES) -> None:
        self._config = config
        self._host = host
        self._families = families
        self._tracked: dict[str, _Tracked] = {}
        # The active alerts by their labels without ``gpu`` (see _identity), built at the first lookup of an
        # evaluation and dropped before the states advance: one pass over the alerts per evaluation instead of one per
        # untracked condition (8x32: ~100 conditions x the alerts, the largest cost of a poll in the profile).
        self._by_labels: dict[tuple[tuple[str, str], ...], str] | None = None
        # Bumped whenever an alert is added, removed or changes state: the index above is rebuilt only then (most
        # evaluations change no alert's state: with 80 alerts active at 8x32 the rebuild was a fifth of the rules).
        self._changes = 0
        self._indexed_at = -1
        self._names_uuids: set[tuple[str, str]] = set()  # (alertname, uuid) of those alerts: most lookups end here
        self._firing_names: set[str] = set()  # alertnames of the firing alerts (notes for other names are not kept)
        self._stats: dict[str, FamilyStats] = {f.name: FamilyStats() for f in families}
        self._cache: dict[str, tuple[float, list[Condition]]] = {}  # family -> (run at, conditions)
        # family -> (its conditions list, enabled names, ``changes`` then, the (identity, condition) pairs _collect
        # made of it): a family's cached conditions between its runs (the dead-process family's 4,096, every second
        # for 10 s) are fingerprinted once, not at every evaluation, and so is a condition object the family hands
        # back at its next run. The identities depend only on the conditions, the enabled names and the tracked
        # alerts, which change only with ``changes``.
        self._collected: dict[str, tuple[list[Condition], list[str], int, list[tuple[str, Condition]]]] = {}
        self._order: list[_Tracked] | None = None  # the tracked alerts in ``alerts()`` order; None: to sort
        self._timings: dict[tuple[str, str], RuleSection] = {}  # (family, name) -> section, for one evaluation
        self._failing: set[str] = set()  # families whose last run raised
        self.evaluations = 0
        self.last_evaluation: float | None = None

    @property
    def config(self) -> RulesConfig:
        return self._config

    @property
    def host(self) -> str:
        return self._host

    @property
    def changes(self) -> int:
        """A count bumped whenever an alert is added, removed or changes state: while it stays the same, the
        pending and firing alerts are the same alerts with the same names, labels, severities and states (only
        their words and values may have moved)."""
        return self._changes

    @property
    def stats(self) -> dict[str, FamilyStats]:
        """Per family: last evaluation duration, failures so far, last error."""
        return dict(self._stats)

    def reconfigure(self, config: RulesConfig) -> None:
        """Swap the config; alert states are kept (a disabled rule's alerts resolve at the next evaluation)."""
        self._config = config
        self._cache.clear()
        self._collected.clear()
        for t in self._tracked.values():  # a condition's hold may come from the config
            t.applied = None

    def alerts(self) -> list[Alert]:
        """The current view: pending, firing and recently resolved alerts, oldest first."""
        if self._order is None:  # sorted again only when an alert was added or removed (the keys never change)
            self._order = sorted(self._tracked.values(), key=lambda t: t.key)
        return [t.alert for t in self._order]

    def evaluate(self, view: RuleView, now: float) -> list[Alert]:
        """Run every enabled family at ``now`` and advance the state machine; returns ``alerts()``."""
        seen: dict[str, tuple[str, Condition]] = {}
        failed: set[str] = set()
        self._timings = {}
        errors: dict[str, str] = {}
        for fam in self._families:
            enabled = [n for n, sec in fam.sections.items() if sec(self._config).enabled]
            if not enabled:
                continue
            cached = self._cache.get(fam.name)
            if cached is not None and cached[0] <= now < cached[0] + fam.interval(self._config):
                conds = cached[1]
                self._collect(fam.name, conds, enabled, seen)
                continue
            t0 = time.perf_counter()
            try:
                conds = fam.evaluate(view, now, self._config)
            except Exception as e:  # a broken family must not silence the others; it is counted and logged
                st = self._stats[fam.name]
                if fam.name not in self._failing:  # once per streak of failures, not at every evaluation
                    log.exception("rule family %s failed", fam.name)
                    self._failing.add(fam.name)
                self._stats[fam.name] = FamilyStats(
                    time.perf_counter() - t0, st.failures + 1, f"{type(e).__name__}: {e}"
                )
                failed.add(fam.name)
                errors[fam.name] = f"{type(e).__name__}: {e}"
                continue
            if fam.name in self._failing:
                log.info("rule family %s evaluates again", fam.name)
                self._failing.discard(fam.name)
            st = self._stats[fam.name]  # (not dataclasses.replace: ~10 us, for every family at every evaluation)
            self._stats[fam.name] = FamilyStats(time.perf_counter() - t0, st.failures, st.last_error)
            self._cache[fam.name] = (now, conds)
            self._collect(fam.name, conds, enabled, seen)
        if self._config.rule_failing.enabled:
            names = {f.name: tuple(f.sections) for f in self._families}
            self._collect(FAILING, failing.conditions(errors, names), [failing.ALERTNAME], seen)
        self._advance(seen, failed, now)
        self.evaluations += 1
        self.last_evaluation = now
        return self.alerts()

    # -- internals --------------------------------------------------------------------------------------------

    def _collect(
        self, family: str, conds: list[Condition], enabled: list[str], seen: dict[str, tuple[str, Condition]]
    ) -> None:
        memo = self._collected.get(family)
        same = memo is not None and memo[2] == self._changes and memo[1] == enabled
        if same and memo is not None and memo[0] is conds:
            pairs = memo[3]
        else:
            if self._indexed_at != self._changes:
                self._index()
            # A family that ran again may hand back some of the same condition objects (the dead-process family
            # does for the processes whose words did not change): their identities stand as well. The old list,
            # alive in ``memo`` until here, keeps each id to its object.
            known = {id(c): fp for fp, c in memo[3]} if same and memo is not None else {}
            pairs = []
            for c in conds:
                if c.name not in enabled:
                    continue
                if c.level == "clear" and c.name not in self._firing_names:
                    # A note only words the resolution of an alert of its name that was firing (_advance); with
                    # none, it changes nothing: skip its fingerprint (16x256: ~4k per-process notes per evaluation).
                    continue
                fp = known.get(id(c))
                pairs.append((self._identity(self._labels(c)) if fp is None else fp, c))
            self._collected[family] = (conds, enabled, self._changes, pairs)
        for fp, c in pairs:
            prev = seen.get(fp)
            # Two conditions for one identity: the strongest level wins (raise > hold > clear).
            if prev is None or _RANK[c.level] > _RANK[prev[1].level]:
                seen[fp] = (family, c)

    def _identity(self, labels: dict[str, str]) -> str:
        """The fingerprint an incoming condition belongs to.

        A GPU re-enumerated at another index (eGPU replugged, a hot-add shifting indices) is the same GPU: an
        ongoing alert on it keeps the identity and the ``gpu`` label it was announced with, instead of becoming a
        second alert that would be notified again. Identity follows the UUID; only ``gpu`` may differ.
        """
        fp = fingerprint(labels)
        if fp in self._tracked or "gpu" not in labels or labels.get("uuid", "unknown") == "unknown":
            return fp
        if self._indexed_at != self._changes:
            self._index()
        assert self._by_labels is not None
        if (labels.get("alertname", ""), labels["uuid"]) not in self._names_uuids:
            return fp  # no active alert of this name on this GPU (the common case: one set lookup)
        return self._by_labels.get(_without_gpu(labels), fp)

    def _index(self) -> None:
        """The active alerts by labels without ``gpu``, their (alertname, uuid) and the names of the firing ones."""
        self._by_labels = {}
        self._names_uuids = set()
        self._firing_names = set()
        self._indexed_at = self._changes
        for tfp, t in self._tracked.items():  # the first (oldest) one wins, as a scan in order would find it
            if t.alert.state != "resolved":
                self._by_labels.setdefault(_without_gpu(t.ident), tfp)
                self._names_uuids.add((t.alert.labels.get("alertname", ""), t.alert.labels.get("uuid", "")))
                if t.alert.state == "firing":
                    self._firing_names.add(t.alert.name)

    def _labels(self, c: Condition) -> dict[str, str]:
        labels = {"alertname": c.name, "severity": c.severity, "host": self._host}
        labels.update(c.labels)
        return labels

    def _timing(self, family: str, name: str) -> RuleSection:
        """The config section of an alertname of a family, looked up once per evaluation (``_timings``)."""
        sec = self._timings.get((family, name))
        if sec is None:
            sec = self._timings[(family, name)] = self._section(family, name)
        return sec

    def _section(self, family: str, name: str) -> RuleSection:
        if family == FAILING:
            return self._config.rule_failing
        for fam in self._families:
            if fam.name == family and name in fam.sections:
                return fam.sections[name](self._config)
        raise KeyError(name)

    def _advance(self, seen: dict[str, tuple[str, Condition]], failed: set[str], now: float) -> None:
        for fp, (family, c) in seen.items():
            tracked = self._tracked.get(fp)
            if tracked is not None and tracked.applied is c:
                st = tracked.alert.state
                if st == "firing" or (st == "pending" and (
                        tracked.fire_from is None or not now - tracked.fire_from >= tracked.hold_for)):
                    # The condition object applied last time, to an alert still firing, or pending and not due:
                    # the path below would find the evidence timed and the run going (or still not able to fire),
                    # nothing to fire and the same words, and set only this.
                    tracked.last_held = now
                    continue
            active = tracked is not None and tracked.alert.state != "resolved"
            if c.level == "clear" or (c.level == "hold" and not active):
                continue
            sec = self._timing(family, c.name)
            hold_for = sec.for_ if c.hold_for is None else c.hold_for
            if tracked is None or not active:
                state: AlertState = "firing" if hold_for <= 0 else "pending"
                ident = self._labels(c)
                alert = Alert(
                    name=c.name,
                    severity=c.severity,
                    labels={**ident, **c.attribution} if c.attribution else ident,
                    summary=c.summary,
                    description=c.description,
                    state=state,
                    active_at=now,
                    fired_at=now if state == "firing" else None,
                    value=c.value,
                    annotations=_annotations(c),
                )
                self._tracked[fp] = _Tracked(family, alert, now, {c.evidence: now}, now,
                                             (now, c.name, alert.fingerprint), c, now, hold_for, ident)
                self._order = None
                self._changes += 1
                continue
            assert tracked is not None
            a = tracked.alert
            can_fire = c.level == "raise" or c.fire_on_hold
            fire = False
            fire_from = None
            if can_fire:
                start = tracked.since.setdefault(c.evidence, now)
                if tracked.run_since is None:
                    tracked.run_since = now
                fire_from = min(start, tracked.run_since)
                fire = a.state == "pending" and now - fire_from >= hold_for
            else:
                tracked.run_since = None
            tracked.last_held = now
            tracked.applied, tracked.fire_from, tracked.hold_for = c, fire_from, hold_for
            annotations = _annotations(c)
            # A pending alert's labels follow its attribution (nothing has been told of it yet); a firing one's
            # were frozen when it fired: receivers and Alertmanager know it by those.
            labels = a.labels
            if a.state == "pending":
                current = {**tracked.ident, **c.attribution} if c.attribution else tracked.ident
                if current != labels:
                    labels = current
            if not fire and labels is a.labels and (a.summary, a.description, a.value, a.annotations) == (
                    c.summary, c.description, c.value, annotations):
                continue  # the same words and value: the alert stays the object it was
            tracked.alert = _reworded(a, c, "firing" if fire else a.state, now if fire else a.fired_at,
                                      labels=labels, annotations=annotations)
            if fire or labels is not a.labels:
                self._changes += 1

        # "clear" notes carry the resolution message; matched by identity, else by (alertname, uuid) because a
        # re-attached GPU may come back at another index (another ``gpu`` label).
        notes = {fp: c for fp, (_, c) in seen.items() if c.level == "clear"}
        # Notes about one process or one kind of series (the leak rule's) never stand in for another's.
        notes_by_uuid = {(c.name, c.labels.get("uuid", "")): c for c in notes.values()
                         if "pid" not in c.labels and "kind" not in c.labels}
        retention = self._config.resolved_retention
        for fp, tracked in list(self._tracked.items()):
            a = tracked.alert
            if a.state == "resolved":
                if a.resolved_at is not None and now - a.resolved_at > retention:
                    del self._tracked[fp]
                    self._order = None
                    self._changes += 1
                continue
            if tracked.last_held == now or tracked.family in failed:
                continue
            if a.state == "pending":
                del self._tracked[fp]  # never fired: vanishes silently, like Prometheus
                self._order = None
                self._changes += 1
                continue
            try:
                sec = self._timing(tracked.family, a.name)
                keep = sec.keep_firing_for if sec.enabled else 0.0
            except KeyError:  # the family is gone from the engine: resolve
                keep = 0.0
            if now - tracked.last_held < keep:
                continue
            note = (notes.get(fp) or notes_by_uuid.get((a.name, a.labels.get("uuid", "")))
                    or _partial_note(notes.values(), a))
            summary, description = a.summary, a.description
            # What to do was for the fault: a resolution carries its note's advice, if any, never the firing one's.
            annotations = {k: v for k, v in a.annotations.items() if k != advice.ACTION}
            if note is not None:
                summary, description = note.summary, note.description
                if advice.ACTION in note.annotations:
                    annotations[advice.ACTION] = note.annotations[advice.ACTION]
            tracked.alert = replace(a, state="resolved", resolved_at=now, summary=summary, description=description,
                                    annotations=annotations)
            tracked.applied = None
            self._changes += 1


def _reworded(a: Alert, c: Condition, state: AlertState, fired_at: float | None, *, labels: dict[str, str],
              annotations: dict[str, str]) -> Alert:
    """``a`` with the words and value of ``c``, the labels, annotations and state given: ``dataclasses.replace``
    spelled out (replace walks the fields by name, ~2.5 us an alert: 4,096 alerts whose age moved in their words,
    every minute at 16x256 with every process gone). tests/rules/test_engine_reuse.py checks every field is here."""
    return Alert(
        name=a.name,
        severity=a.severity,
        labels=labels,
        summary=c.summary,
        description=c.description,
        state=state,
        active_at=a.active_at,
        fired_at=fired_at,
        resolved_at=a.resolved_at,
        value=c.value,
        annotations=annotations,
    )


def _annotations(c: Condition) -> dict[str, str]:
    """The alert's annotations: the condition's (a family puts the owner facts known now there, which the alert's
    frozen labels may lack or state as they were when it fired: rules/condition.py ``owner_labels``)."""
    return dict(c.annotations)


def _partial_note(notes: Iterable[Condition], a: Alert) -> Condition | None:
    """A note whose labels the alert carries, apart from ``gpu``: a gone process' note knows its pid but not its
    name, the alert's ``process`` label."""
    for c in notes:
        if c.name == a.name and "pid" in c.labels and all(
            k == "gpu" or a.labels.get(k) == v for k, v in c.labels.items()
        ):
            return c
    return None


def _without_gpu(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "gpu"))


_RANK = {"clear": 0, "hold": 1, "raise": 2}
