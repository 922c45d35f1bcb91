"""Self-metrics of the rules engine and the active alerts as a series, like Prometheus' ``ALERTS``.

``gpuwatchd_alerts{alertname,alertstate,severity,<alert labels>} 1`` for every pending or firing alert (resolved
ones are not series, as in Prometheus), plus per rule family the last evaluation's duration and a failure
counter. Built fresh from the engine on each scrape: no I/O, no evaluation.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwatchd.rules.engine import RulesEngine


class AlertsCollector(Collector):
    """prometheus_client collector over a ``RulesEngine``."""

    def __init__(self, engine: RulesEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        alerts = Metric("gpuwatchd_alerts", "Pending and firing alerts, one series each (like Prometheus' ALERTS).",
                        "gauge")
        for a in self._engine.alerts():
            if a.state == "resolved":
                continue
            labels = {**a.labels, "alertname": a.name, "alertstate": a.state, "severity": a.severity}
            alerts.add_sample("gpuwatchd_alerts", labels, 1.0)
        yield alerts

        duration = GaugeMetricFamily(
            "gpuwatchd_rule_evaluation_duration_seconds",
            "Duration of the last evaluation of each rule family.",
            labels=["family"],
        )
        failures = CounterMetricFamily(
            "gpuwatchd_rule_evaluation_failures",
            "Evaluations of a rule family that raised (the other families still ran).",
            labels=["family"],
        )
        for family, st in sorted(self._engine.stats.items()):
            duration.add_metric([family], st.duration_seconds)
            failures.add_metric([family], float(st.failures))
        yield duration
        yield failures
        evals = CounterMetricFamily("gpuwatchd_rule_evaluations", "Rule engine evaluations since start.")
        evals.add_metric([], float(self._engine.evaluations))
        yield evals
