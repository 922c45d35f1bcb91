"""Metric specs and a per-scrape family builder.

A ``Spec`` names one exported family once (name, type, labels, unit, HELP); the builders in ``gpu_families`` and
``runtime_families`` add samples against specs. ``Families`` creates a family on its first sample only, so a
reading nobody has (``None``) produces neither a sample nor an empty family: "unknown" is never exported as 0.
The module-level ``SPECS`` registry is the catalogue ``docs/metrics.md`` is checked against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.samples import Sample

Kind = Literal["gauge", "counter", "info"]

SPECS: dict[str, Spec] = {}  # exposition name -> spec, filled by ``spec()`` at import


@dataclass(frozen=True, slots=True)
class Spec:
    """One metric family as exposed in the Prometheus text format (counters carry ``_total``, info ``_info``)."""

    name: str
    kind: Kind
    doc: str
    labels: tuple[str, ...] = ()
    unit: str = ""  # OpenMetrics UNIT; the name must end with it

    def new(self) -> Metric:
        """A fresh, empty family for this spec."""
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.doc, labels=self.labels, unit=self.unit)
        if self.kind == "info":
            return InfoMetricFamily(self.name.removesuffix("_info"), self.doc, labels=())
        return GaugeMetricFamily(self.name, self.doc, labels=self.labels, unit=self.unit)


def spec(name: str, kind: Kind, doc: str, labels: Sequence[str] = (), unit: str = "") -> Spec:
    """Declare a family (names are unique across the exporter)."""
    if name in SPECS:
        raise ValueError(f"duplicate metric name {name}")
    if kind == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name} must end with _total")
    if kind == "info" and not name.endswith("_info"):
        raise ValueError(f"info metric {name} must end with _info")
    if unit and not name.removesuffix("_total").endswith("_" + unit):
        raise ValueError(f"{name} must end with its unit {unit}")
    s = Spec(name, kind, doc, tuple(labels), unit)
    SPECS[name] = s
    return s


class Families:
    """Families of one group for one scrape, created lazily in first-sample order."""

    __slots__ = ("_fams",)

    def __init__(self) -> None:
        self._fams: dict[str, Metric] = {}

    def _family(self, s: Spec) -> Metric:
        fam = self._fams.get(s.name)
        if fam is None:
            fam = self._fams[s.name] = s.new()
        return fam

    def add(self, s: Spec, labelvalues: Sequence[str], value: float | bool | None) -> None:
        """One sample; ``None`` adds nothing."""
        if value is None:
            return
        if len(labelvalues) != len(s.labels):
            raise ValueError(f"{s.name}: expected labels {s.labels}, got {len(labelvalues)} values")
        fam = self._family(s)
        fam.add_metric(labelvalues, float(value))  # type: ignore[attr-defined]

    def add_owned(self, s: Spec, labelvalues: Sequence[str], owner: Mapping[str, str] | None,
                  value: float | bool | None) -> None:
        """One sample whose first labels are ``labelvalues`` and whose remaining labels of the spec (the owner
        labels of a process: container_id, namespace, ...) appear only where ``owner`` has a non-empty value:
        absent, not empty, where unknown."""
        if value is None:
            return
        fixed = s.labels[: len(labelvalues)]
        labels = dict(zip(fixed, labelvalues, strict=True))
        if owner:
            for k in s.labels[len(labelvalues):]:
                v = owner.get(k)
                if v:
                    labels[k] = v
        fam = self._family(s)
        fam.samples.append(Sample(s.name, labels, float(value)))

    def info(self, s: Spec, labels: Mapping[str, str]) -> None:
        """One ``_info`` sample (value 1) carrying ``labels``."""
        if s.kind != "info":
            raise ValueError(f"{s.name} is not an info metric")
        fam = self._family(s)
        fam.add_metric([], dict(labels))  # type: ignore[attr-defined]

    def metrics(self) -> list[Metric]:
        return list(self._fams.values())


def label(value: object) -> str:
    """A label value: ``None`` becomes the empty string (which Prometheus treats as an absent label)."""
    return "" if value is None else str(value)
