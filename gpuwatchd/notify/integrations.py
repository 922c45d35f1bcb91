"""The receiver types: ``ReceiverType`` name -> :class:`~gpuwatchd.notify.integration.Integration`."""

from __future__ import annotations

from gpuwatchd.notify import alertmanager, discord, mattermost, ntfy, slack, teams, webhook
from gpuwatchd.notify.integration import Integration, json_integration

INTEGRATIONS: dict[str, Integration] = {
    "slack": json_integration(slack.render),
    "discord": json_integration(discord.render),
    "teams": json_integration(teams.render),
    "mattermost": json_integration(mattermost.render),
    "webhook": webhook.INTEGRATION,
    "alertmanager": alertmanager.INTEGRATION,
    "ntfy": ntfy.INTEGRATION,
}


def integration(receiver_type: str) -> Integration:
    """The integration of a receiver type (the config's ``ReceiverType`` admits only these names)."""
    return INTEGRATIONS[receiver_type]
