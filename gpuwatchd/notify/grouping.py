"""Pure decisions of the dispatcher: routing, group keys, inhibition, and Alertmanager's "needs update" rule.

No I/O and no clock: alerts, config and ``now`` in, decision out (style habit 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from gpuwatchd.model import Alert, fingerprint
from gpuwatchd.notify.config import InhibitRuleConfig, NotifyConfig
from gpuwatchd.notify.matchers import matches_all


@dataclass(frozen=True, slots=True)
class Route:
    """Where an alert goes and with which timings (a flattened Alertmanager route)."""

    index: int  # position in config.routes; -1 for the default route
    receiver: str
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float

    @property
    def key(self) -> str:
        """Route identity inside group keys (Alertmanager's route key, e.g. ``{}/0``)."""
        return "{}" if self.index < 0 else f"{{}}/{self.index}"


def routes_for(labels: Mapping[str, str], config: NotifyConfig) -> list[Route]:
    """Matching routes in order; first match wins unless it says ``continue``; none -> the default receiver."""
    out: list[Route] = []
    for i, r in enumerate(config.routes):
        if not matches_all(r.matchers, labels):
            continue
        receiver = r.receiver or config.fallback_receiver
        if receiver is not None:
            out.append(
                Route(
                    index=i,
                    receiver=receiver,
                    group_by=r.group_by if r.group_by is not None else config.group_by,
                    group_wait=r.group_wait if r.group_wait is not None else config.group_wait,
                    group_interval=r.group_interval if r.group_interval is not None else config.group_interval,
                    repeat_interval=r.repeat_interval if r.repeat_interval is not None else config.repeat_interval,
                )
            )
        if not r.continue_:
            return out
    if not out and config.fallback_receiver is not None:
        out.append(
            Route(
                -1,
                config.fallback_receiver,
                config.group_by,
                config.group_wait,
                config.group_interval,
                config.repeat_interval,
            )
        )
    return out


def group_labels(labels: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    """The grouping labels the alert has (absent ones are left out, like Alertmanager)."""
    return {k: labels[k] for k in group_by if k in labels}


def group_key(route: Route, glabels: Mapping[str, str]) -> str:
    """``{}/0:{alertname="GpuLost", uuid="GPU-1"}`` — Alertmanager's ``routeKey:groupLabels`` form."""
    inner = ", ".join(f'{k}="{glabels[k]}"' for k in sorted(glabels))
    return f"{route.key}:{{{inner}}}"


@lru_cache(maxsize=8192)
def _fingerprint(items: tuple[tuple[str, str], ...]) -> str:
    return fingerprint(dict(items))


def alert_fp(alert: Alert) -> str:
    """``alert.fingerprint``, memoised: the model's pure-Python FNV hash costs ~40 us and the dispatcher asks often."""
    return _fingerprint(tuple(sorted(alert.labels.items())))


class Inhibitor:
    """Inhibition against one set of firing alerts (built once per evaluation: sources are pre-filtered per rule).

    Alertmanager semantics: target matches ``target_matchers``, a firing source matches ``source_matchers``, the
    ``equal`` labels agree (missing = empty), and an alert matching both sides is not inhibited by a source that
    also matches both sides.
    """

    def __init__(self, firing: Iterable[Alert], rules: Sequence[InhibitRuleConfig]) -> None:
        firing = list(firing)
        self._rules = [
            (r, [(alert_fp(a), a) for a in firing if matches_all(r.source_matchers, a.labels)]) for r in rules
        ]

    def inhibited_by(self, alert: Alert) -> str | None:
        """Fingerprint of a firing alert that inhibits ``alert``, or None."""
        lab = alert.labels
        fp = alert_fp(alert)
        for rule, sources in self._rules:
            if not sources or not matches_all(rule.target_matchers, lab):
                continue
            two_sided = matches_all(rule.source_matchers, lab)
            for src_fp, src in sources:
                if src_fp == fp or any(src.labels.get(k, "") != lab.get(k, "") for k in rule.equal):
                    continue
                if two_sided and matches_all(rule.target_matchers, src.labels):
                    continue
                return src_fp
        return None


def inhibited_by(alert: Alert, firing: Iterable[Alert], rules: Sequence[InhibitRuleConfig]) -> str | None:
    """One-off form of :class:`Inhibitor`."""
    return Inhibitor(firing, rules).inhibited_by(alert)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """What a receiver was last told about a group (Alertmanager's nflog entry)."""

    firing: frozenset[str]
    resolved: frozenset[str]
    timestamp: float


def needs_update(
    entry: LogEntry | None,
    firing: frozenset[str],
    resolved: frozenset[str],
    *,
    send_resolved: bool,
    repeat_interval: float,
    now: float,
) -> str | None:
    """Alertmanager's ``DedupStage.needsUpdate``; returns the notification reason, or None for "nothing to send"."""
    if entry is None:
        return "first notification" if firing else None
    if not firing <= entry.firing:
        return "new alerts added"
    if not firing:
        # Sent even with send_resolved=false so the log forgets the firing set; the receiver knew nothing of
        # alerts that fired and resolved between two sends.
        return "all alerts resolved" if entry.firing else None
    if send_resolved and not resolved <= entry.resolved:
        return "some alerts resolved"
    if entry.timestamp <= now - repeat_interval:
        return "repeat interval elapsed"
    return None


@dataclass(frozen=True, slots=True)
class Notification:
    """One message to one receiver about one group: what every integration renders."""

    receiver: str
    group_key: str
    group_labels: dict[str, str]
    alerts: tuple[Alert, ...]  # firing first, then resolved; each sorted by labels
    host: str
    now: float
    reason: str = "first notification"
    external_url: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def firing(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if a.state != "resolved")

    @property
    def resolved(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if a.state == "resolved")

    @property
    def status(self) -> str:
        """``resolved`` only when every alert is resolved (Alertmanager)."""
        return "firing" if self.firing else "resolved"

    @property
    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    @property
    def common_annotations(self) -> dict[str, str]:
        return _common([alert_annotations(a) for a in self.alerts])


def alert_annotations(alert: Alert) -> dict[str, str]:
    """Alertmanager-style annotations: summary and description plus the alert's extra ones."""
    out = {"summary": alert.summary, "description": alert.description}
    out.update(alert.annotations)
    return {k: v for k, v in out.items() if v}


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def sort_alerts(alerts: Iterable[Alert]) -> tuple[Alert, ...]:
    """Firing first, then resolved; inside each, by sorted labels (stable messages)."""
    return tuple(sorted(alerts, key=lambda a: (a.state == "resolved", sorted(a.labels.items()))))
