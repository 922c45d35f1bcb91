"""Self-metrics of alert delivery, in a private registry the daemon's exporter collects from.

Label values are receiver names and integration types only, never URLs (they are secrets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Chat webhooks answer in 0.1-2 s; the long tail is the timeout (default 10 s).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class GaugeState:
    """What the gauges show, read from the dispatcher's memory on each scrape."""

    depths: dict[str, int] = field(default_factory=dict)
    silences: dict[str, int] = field(default_factory=dict)
    inhibited: int = 0
    silenced: int = 0
    groups: int = 0
    receivers: int = 0


class _Gauges(Collector):
    def __init__(self, read: Callable[[], GaugeState]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        state = self._read()
        depth = GaugeMetricFamily(
            "gpuwatchd_notification_outbox_depth", "Notifications waiting for delivery.", labels=["receiver"]
        )
        for name, n in sorted(state.depths.items()):
            depth.add_metric([name], n)
        yield depth
        sil = GaugeMetricFamily("gpuwatchd_silences", "Silences by state.", labels=["state"])
        for st, n in sorted(state.silences.items()):
            sil.add_metric([st], n)
        yield sil
        yield GaugeMetricFamily(
            "gpuwatchd_alerts_inhibited", "Firing alerts muted by an inhibit rule.", value=float(state.inhibited)
        )
        yield GaugeMetricFamily(
            "gpuwatchd_alerts_silenced", "Firing alerts muted by a silence.", value=float(state.silenced)
        )
        yield GaugeMetricFamily(
            "gpuwatchd_notification_groups", "Active aggregation groups.", value=float(state.groups)
        )
        yield GaugeMetricFamily(
            "gpuwatchd_notify_receivers",
            "Receivers configured (notify.receivers); 0: alerts reach nobody, only the API and the status page.",
            value=float(state.receivers),
        )


class NotifyMetrics:
    """Counters updated by the delivery workers plus gauges read from the dispatcher on scrape (no I/O)."""

    def __init__(self, read_state: Callable[[], GaugeState]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.notifications = Counter(
            "gpuwatchd_notifications",
            "Notification attempts by outcome (success, failure = given up, retry = will try again).",
            ["receiver", "integration", "outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "gpuwatchd_notification_failures",
            "Failed attempts by reason (http_<status>, timeout, connection, expired).",
            ["receiver", "integration", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpuwatchd_notification_latency_seconds",
            "Duration of one HTTP delivery attempt.",
            ["receiver", "integration"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(read_state))

    def outcome(self, receiver: str, integration: str, outcome: str, reason: str | None = None) -> None:
        self.notifications.labels(receiver, integration, outcome).inc()
        if reason is not None and outcome != "success":
            self.failures.labels(receiver, integration, reason).inc()

    def collector(self) -> Collector:
        """Everything above as one Collector."""
        return _RegistryCollector(self.registry)


class _RegistryCollector(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
