"""Routing and grouping: which receivers an alert goes to, with which timings, and its aggregation group key.

Alertmanager's route tree, flattened (``notify.routes`` in order, ``continue``, a fallback receiver). Pure: labels
and config in, decision out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwatchd.notify.config import NotifyConfig
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
