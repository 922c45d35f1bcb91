"""``gpuwatchd notify test [--config FILE] [--receiver NAME]``: send a test notification to each receiver.

The message goes through the real delivery path: the receiver's own renderer (Slack, Discord, Teams, Mattermost,
webhook, Alertmanager) and :func:`gpuwatchd.notify.delivery.post_once`, the POST every notification makes (headers,
HMAC signature, timeout, no redirects, the same success/retry/permanent classification). One line per receiver
with the HTTP status and latency, or the error as the service sent it; exit 1 when any receiver failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import NotifyConfig, ReceiverConfig
from gpuwatchd.runtime.exitcodes import EXIT_OK, EXIT_USAGE

EXIT_FAILED = 1
TEST_ALERT = "GpuwatchdTest"


def add_parser(sub: Any) -> None:
    """The ``notify`` command with its ``test`` sub-command."""
    p = sub.add_parser("notify", help="notification tools: `notify test` sends a test message to each receiver")
    s = p.add_subparsers(dest="notify_command", metavar="SUBCOMMAND", required=True)
    t = s.add_parser("test", help="send a test notification through each receiver of a config and print the result")
    t.add_argument("--config", type=Path,
                   help="config file with notify.receivers (default: /etc/gpuwatchd/gpuwatchd.yml)")
    t.add_argument("--receiver", action="append", metavar="NAME", help="only this receiver (repeatable)")


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


async def send_tests(config: NotifyConfig, receivers: list[ReceiverConfig], host: str) -> list[tuple[str, bool]]:
    """Send to each receiver (each member of an Alertmanager cluster) in turn; (printed line, ok) for each."""
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


def cmd_notify(args: argparse.Namespace) -> int:
    """``notify test``: 0 when every receiver took the message, 1 when one did not, 2 nothing to test."""
    from gpuwatchd.config.files import missing, shown_path
    from gpuwatchd.config.loader import ConfigError, load_config
    from gpuwatchd.config.paths import DEFAULT_CONFIG_PATH

    path = args.config
    if path is not None and missing(path):
        print(f"gpuwatchd notify: {shown_path(path)}: file not found", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_config(path, required=path is not None)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    source = shown_path(path) if path is not None else (
        str(DEFAULT_CONFIG_PATH) if DEFAULT_CONFIG_PATH.exists() else "the built-in defaults"
    )
    receivers = list(cfg.notify.receivers)
    if not receivers:
        print(f"gpuwatchd notify: no receivers in {source} (notify.receivers): alerts go nowhere but the API "
              "(docs/notifications.md)", file=sys.stderr)
        return EXIT_USAGE
    if args.receiver:
        unknown = [n for n in args.receiver if n not in {r.name for r in receivers}]
        if unknown:
            names = ", ".join(r.name for r in receivers)
            print(f"gpuwatchd notify: unknown receiver {unknown[0]!r} in {source}; receivers: {names}", file=sys.stderr)
            return EXIT_USAGE
        receivers = [r for r in receivers if r.name in args.receiver]
    results = asyncio.run(send_tests(cfg.notify, receivers, cfg.host))
    for line, _ in results:
        print(line)
    return EXIT_OK if all(ok for _, ok in results) else EXIT_FAILED
