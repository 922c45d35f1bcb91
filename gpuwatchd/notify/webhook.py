"""Generic JSON webhook: Alertmanager's webhook payload, version "4", so existing receivers accept it unchanged.

Format from prometheus/alertmanager ``notify/webhook/webhook.go`` and ``template/template.go``: firing alerts carry
the zero time as ``endsAt``. With ``hmac_secret`` set, the body is signed: ``X-Gpuwatchd-Signature:
sha256=<hex HMAC-SHA256 of the exact body bytes>`` (GitHub's webhook convention).
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timezone
from typing import Any

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import ReceiverConfig
from gpuwatchd.notify.fingerprints import alert_fp
from gpuwatchd.notify.integration import Integration, Request, dumps
from gpuwatchd.notify.notification import Notification, alert_annotations

SIGNATURE_HEADER = "X-Gpuwatchd-Signature"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, what Alertmanager sends as a firing alert's endsAt


def rfc3339(ts: float) -> str:
    """UTC RFC 3339 with milliseconds, e.g. ``2026-11-21T23:13:29.123Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def starts_at(a: Alert) -> float:
    """When the alert started firing (Prometheus sends activeAt; we send the firing time if known)."""
    return a.fired_at if a.fired_at is not None else a.active_at


def generator_url(external_url: str) -> str:
    """Link back to this host's alert list, if an external URL is configured."""
    return f"{external_url.rstrip('/')}/api/v1/alerts" if external_url else ""


def render(n: Notification) -> dict[str, Any]:
    """The Alertmanager webhook v4 body."""
    alerts = []
    for a in n.alerts:
        resolved = a.state == "resolved"
        alerts.append(
            {
                "status": "resolved" if resolved else "firing",
                "labels": dict(sorted(a.labels.items())),
                "annotations": alert_annotations(a),
                "startsAt": rfc3339(starts_at(a)),
                "endsAt": rfc3339(a.resolved_at if a.resolved_at is not None else n.now) if resolved else ZERO_TIME,
                "generatorURL": generator_url(n.external_url),
                "fingerprint": alert_fp(a),
            }
        )
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": 0,
        "status": n.status,
        "receiver": n.receiver,
        "groupLabels": n.group_labels,
        "commonLabels": n.common_labels,
        "commonAnnotations": n.common_annotations,
        "externalURL": n.external_url,
        "notification_reason": n.reason,
        "alerts": alerts,
    }


def signature(body: bytes, secret: str) -> str:
    """Header value for ``SIGNATURE_HEADER``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def request(payload: str, rc: ReceiverConfig, url: str) -> Request:
    """The JSON body, signed when the receiver has an ``hmac_secret``."""
    body = payload.encode()
    headers = {}
    if rc.hmac_secret is not None:
        headers[SIGNATURE_HEADER] = signature(body, rc.hmac_secret.get_secret_value())
    return Request(url, body, headers=headers)


INTEGRATION = Integration(render=lambda n: dumps(render(n)), request=request)
