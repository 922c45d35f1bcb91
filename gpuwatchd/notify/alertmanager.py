"""Alertmanager API v2 client: ``POST /api/v2/alerts`` with every firing alert, so fleets route through their own
Alertmanager (which does the grouping, silencing and routing; we do not group for it).

Like Prometheus (``--rules.alert.resend-delay`` 1m, ``rules/alerting.go``): firing alerts are re-posted every
``alertmanager_resend`` with ``endsAt = now + 4 * resend`` so Alertmanager does not resolve them between posts;
resolved ones are posted with ``endsAt`` = their resolution time for ``RESOLVED_RESEND_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import ReceiverConfig
from gpuwatchd.notify.integration import Integration, Request, dumps
from gpuwatchd.notify.notification import Notification, alert_annotations
from gpuwatchd.notify.webhook import generator_url, rfc3339, starts_at

# Prometheus keeps sending a resolved alert for 15 min (rules/alerting.go resolvedRetention).
RESOLVED_RESEND_SECONDS = 15 * 60.0
# endsAt = now + 4 x resend delay, Prometheus' choice: three posts may be lost before Alertmanager resolves.
ENDS_AT_RESENDS = 4
API_PATH = "/api/v2/alerts"


def alerts_url(base: str) -> str:
    """The receiver URL is the Alertmanager base URL; the API path is appended unless already there."""
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    if not path.endswith(API_PATH):
        path += API_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def render(
    alerts: Sequence[Alert],
    now: float,
    resend: float,
    external_url: str = "",
    to_wall: Callable[[float], float] | None = None,
) -> list[dict[str, Any]]:
    """The POST body: postable alerts (labels, annotations, startsAt, endsAt, generatorURL). ``to_wall`` maps the
    daemon's times onto the wall clock where they differ (``runtime.clock.wall_mapper``: a sim at ``--speed``)."""
    wall = to_wall or (lambda t: t)
    out = []
    for a in alerts:
        ends = a.resolved_at if a.state == "resolved" and a.resolved_at is not None else now + ENDS_AT_RESENDS * resend
        out.append(
            {
                "labels": dict(sorted(a.labels.items())),
                "annotations": alert_annotations(a),
                "startsAt": rfc3339(wall(starts_at(a))),
                "endsAt": rfc3339(wall(ends)),
                "generatorURL": generator_url(external_url),
            }
        )
    return out


def request(payload: str, _rc: ReceiverConfig, url: str) -> Request:
    """The postable alerts, to the member's ``/api/v2/alerts``."""
    return Request(alerts_url(url), payload.encode())


def _not_grouped(_n: Notification) -> str:
    raise TypeError("an alertmanager receiver gets alert state pushes (render), never grouped notifications")


# Not grouped: the dispatcher pushes every alert's state (``render`` above) to each member instead.
INTEGRATION = Integration(render=_not_grouped, request=request, grouped=False)


def payload(
    alerts: Sequence[Alert],
    now: float,
    resend: float,
    external_url: str = "",
    to_wall: Callable[[float], float] | None = None,
) -> str:
    """The outbox text of one push."""
    return dumps(render(alerts, now, resend, external_url, to_wall))
