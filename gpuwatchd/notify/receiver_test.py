"""Test notifications: one synthetic ``GpuwatchdTest`` alert through each receiver's real delivery path.

Used by ``gpuwatchd notify test`` (a config's receivers) and by the daemon's ``POST /api/v1/receivers/test`` (its
own). The message is rendered by the receiver's integration and sent by :func:`gpuwatchd.notify.delivery.post_once`,
the POST every notification makes; nothing is queued, logged as notified or retried. Sent by the daemon, each test
spends a token of the member's ``rate_limit_per_minute`` like a notification (``reserve``): a test over the limit
is not sent (200 test requests used to post 200 messages to a receiver limited to 6 a minute).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import Member, NotifyConfig, ReceiverConfig

TEST_ALERT = "GpuwatchdTest"


def test_alert(host: str, receiver: str, now: float) -> Alert:
    """The synthetic alert a test notification carries: severity info, the word "test" in every text."""
    return Alert(
        name=TEST_ALERT,
        severity="info",
        labels={"alertname": TEST_ALERT, "severity": "info", "host": host, "receiver": receiver},
        summary=f"test notification from gpuwatchd on {host} to receiver {receiver!r}: if you read this, it works",
        description="Sent by `gpuwatchd notify test`; nothing is wrong. It is not an alert and resolves nothing.",
        state="firing",
        active_at=now,
        fired_at=now,
    )


def render(rc: ReceiverConfig, config: NotifyConfig, host: str, now: float) -> str:
    """The test message as the receiver's own integration renders it (the outbox text a delivery would send)."""
    from gpuwatchd.notify import alertmanager
    from gpuwatchd.notify.integrations import integration
    from gpuwatchd.notify.notification import Notification

    alert = test_alert(host, rc.name, now)
    if not integration(rc.type).grouped:  # Alertmanager: the state push every firing alert gets
        return alertmanager.payload([alert], now, config.alertmanager_resend, config.external_url)
    n = Notification(
        receiver=rc.name, group_key=f'{{}}:{{alertname="{TEST_ALERT}"}}', group_labels={"alertname": TEST_ALERT},
        alerts=(alert,), host=host, now=now, reason="test", external_url=config.external_url,
    )  # fmt: skip
    return integration(rc.type).render(n)


async def send_tests(
    config: NotifyConfig, receivers: list[ReceiverConfig], host: str,
    reserve: Callable[[Member], float] | None = None,
) -> list[tuple[str, bool]]:
    """Send to each receiver (each member of an Alertmanager cluster) in turn; (printed line, ok) for each.

    ``reserve(member)`` spends a token of the member's rate limit: 0 when taken, else the seconds until one is free
    (then that member is not sent to)."""
    import aiohttp

    from gpuwatchd.notify.delivery import post_once, receiver_secrets
    from gpuwatchd.notify.redaction import secret_fragments

    out: list[tuple[str, bool]] = []
    async with aiohttp.ClientSession() as session:
        for rc in receivers:
            secrets = secret_fragments(receiver_secrets(rc))
            for m in rc.members:
                now = time.time()
                what = f"{rc.name} ({rc.type})" if len(rc.members) == 1 else f"{m.endpoint} ({rc.type})"
                wait = reserve(m) if reserve is not None else 0.0
                if wait > 0:
                    out.append((f"{what}: NOT SENT: rate_limit_per_minute {rc.rate_limit_per_minute:g} reached"
                                f" (tests count against it); try again in {math.ceil(wait):.0f} s", False))
                    continue
                try:
                    payload = render(rc, config, host, now)
                except (KeyError, ValueError) as e:
                    out.append((f"{what}: FAILED: cannot render a message: {e}", False))
                    continue
                r = await post_once(session, rc, payload, url=m.url.get_secret_value(), endpoint=m.endpoint,
                                    idempotency_key=f"test-{uuid.uuid4().hex}", secrets=secrets, now=now)
                ms = f"{r.seconds * 1000:.0f} ms"
                if r.verdict.outcome == "success":
                    out.append((f"{what}: OK: HTTP {r.status} in {ms}", True))
                else:
                    status = f"HTTP {r.status}" if r.status is not None else "no answer"
                    out.append((f"{what}: FAILED: {status} after {ms}: {r.error}", False))
    return out
