"""Self-metrics of remediation, built fresh on each scrape from these counters (no I/O on the scrape path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


@dataclass
class Counters:
    actions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (system, action, result) -> count
    errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (system, reason) -> count
    up: dict[str, bool] = field(default_factory=dict)  # system -> the last call to it worked
    escalations: int = 0
    acks: dict[str, int] = field(default_factory=dict)  # kind -> count

    def action(self, system: str, action: str, result: str) -> None:
        key = (system, action, result)
        self.actions[key] = self.actions.get(key, 0) + 1

    def error(self, system: str, reason: str) -> None:
        self.errors[(system, reason)] = self.errors.get((system, reason), 0) + 1


class RemediationCollector(Collector):
    def __init__(self, counters: Counters, drained: Callable[[], dict[str, int]],
                 escalated: Callable[[], dict[str, int]]) -> None:
        self.counters = counters
        self._drained = drained
        self._escalated = escalated

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        actions = CounterMetricFamily(
            "gpuwatchd_remediation_actions",
            "Remediation actions by system (slurm, nvsentinel), action (drain, resume, event) and result (ok, failed, "
            "dry_run, skipped: left to a person who changed the node).",
            labels=["system", "action", "result"])
        for (system, action, result), n in sorted(c.actions.items()):
            actions.add_metric([system, action, result], n)
        yield actions
        errors = CounterMetricFamily(
            "gpuwatchd_remediation_errors",
            "Remediation calls that failed, by system and reason (missing: the command or socket is absent).",
            labels=["system", "reason"])
        for (system, reason), n in sorted(c.errors.items()):
            errors.add_metric([system, reason], n)
        yield errors
        up = GaugeMetricFamily("gpuwatchd_remediation_up",
                               "1 when the last call to the system worked (absent before the first call).",
                               labels=["system"])
        for system, ok in sorted(c.up.items()):
            up.add_metric([system], 1.0 if ok else 0.0)
        yield up
        drained = GaugeMetricFamily("gpuwatchd_remediation_node_drained",
                                    "1 while gpuwatchd holds a drain of the node it set (dry_run: would hold).",
                                    labels=["system", "node", "dry_run"])
        for key, v in sorted(self._drained().items()):
            system, node, dry = key.split("\0")
            drained.add_metric([system, node, dry], v)
        yield drained
        esc = GaugeMetricFamily("gpuwatchd_gpu_health_escalation",
                                "Per GPU: 0 none; 1 the action asked for did not help (drain and inspect); 2 or more: "
                                "replace the GPU. Reset by `gpuwatchd health ack`.", labels=["uuid"])
        for uuid, level in sorted(self._escalated().items()):
            esc.add_metric([uuid], level)
        yield esc
        yield CounterMetricFamily("gpuwatchd_health_escalations",
                                  "Escalations: a failure back after the action it asked for.", value=c.escalations)
        acks = CounterMetricFamily("gpuwatchd_health_acks", "Operator acknowledgements by kind.", labels=["kind"])
        for kind, n in sorted(c.acks.items()):
            acks.add_metric([kind], n)
        yield acks
