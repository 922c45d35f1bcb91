"""Self-metrics of the rules engine and the active alerts as a series, like Prometheus' ``ALERTS``.

``gpuwatchd_alerts{alertname,alertstate,severity,<alert labels>} 1`` for every pending or firing alert (resolved
ones are not series, as in Prometheus), plus per rule family the last evaluation's duration and a failure
counter. Built from the engine at scrape time (the alerts series only when the alerts changed): no I/O, no
evaluation.
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
        self._alerts: tuple[int, Metric] | None = None  # (engine.changes it was built at, the frozen family)

    def _alerts_family(self) -> Metric:
        """``gpuwatchd_alerts``, rebuilt only when an alert was added, removed or changed state (``changes``): with
        4,096 alerts (16 x 256 processes, each gone) building it on every render held the event loop for 10-40 ms.
        The series show names, labels, severities and states, which only such a change moves. The family is
        handed to every render as it is: encoders only read it."""
        changes = self._engine.changes
        if self._alerts is not None and self._alerts[0] == changes:
            return self._alerts[1]
        alerts = Metric("gpuwatchd_alerts", "Pending and firing alerts, one series each (like Prometheus' ALERTS).",
                        "gauge")
        for a in self._engine.alerts():
            if a.state == "resolved":
                continue
            labels = {**a.labels, "alertname": a.name, "alertstate": a.state, "severity": a.severity}
            alerts.add_sample("gpuwatchd_alerts", labels, 1.0)
        self._alerts = (changes, alerts)
        return alerts

    def collect(self) -> Iterable[Metric]:
        yield self._alerts_family()

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
