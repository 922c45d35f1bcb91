"""One message to one receiver about one group (what every integration renders), and the helpers it is built with."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwatchd.model import Alert


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
