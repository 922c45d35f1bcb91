"""Inhibition: a firing source alert mutes target alerts whose ``equal`` labels agree (Alertmanager's inhibitor)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import InhibitRuleConfig
from gpuwatchd.notify.fingerprints import alert_fp
from gpuwatchd.notify.matchers import matches_all


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
