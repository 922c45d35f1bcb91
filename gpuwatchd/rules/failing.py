"""``GpuwatchdRuleFailing``: a rule family that raises at every evaluation is a silent monitor, so it is an alert.

The engine already logs and counts a family that raises (``gpuwatchd_rule_evaluation_failures_total{family}``)
and keeps that family's alerts as they were; but while it keeps failing, none of its alerts can start or fire. This
module turns "failed at this evaluation" into a condition the engine runs through the normal state machine (``for:``
from ``rules.rule_failing``), so the fault reaches chat like any alert and resolves when the family runs again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwatchd.rules.condition import Condition

ALERTNAME = "GpuwatchdRuleFailing"
_MAX_ERROR = 200  # the error text goes into a chat message: one short line


def conditions(failed: Mapping[str, str], alertnames: Mapping[str, Sequence[str]]) -> list[Condition]:
    """One ``raise`` per family that failed at this evaluation (``failed``: family -> its error)."""
    out = []
    for family, raw in sorted(failed.items()):
        error = " ".join(raw.split())
        if len(error) > _MAX_ERROR:
            error = error[: _MAX_ERROR - 3] + "..."
        names = ", ".join(alertnames.get(family, ())) or family
        out.append(
            Condition(
                name=ALERTNAME,
                severity="warning",
                labels={"family": family},
                summary=f"rule family {family} fails at every evaluation ({error})",
                description=f"While it fails, {names} cannot fire. The daemon log has the traceback "
                f"(`rule family {family} failed`); check `rules.{family}` in the config, then report it as a bug.",
            )
        )
    return out
