"""Microsoft Teams through a Power Automate "Workflows" webhook: an Adaptive Card in the ``attachments`` envelope.

This is what Alertmanager's msteamsv2 sends; O365-connector URLs are retired. The flow answers 202 Accepted.
Teams caps a message at 28 KB (learn.microsoft.com, incoming webhooks); UTF-8 needs up to 4 bytes a character,
so the text is cut at 6000 characters, leaving room for the card envelope.
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.notify.format import body_text, title, truncate
from gpuwatchd.notify.notification import Notification

TEXT_LIMIT = 6000
TITLE_LIMIT = 400
COLOR = {"critical": "Attention", "warning": "Warning", "info": "Accent"}


def render(n: Notification) -> dict[str, Any]:
    """The JSON body posted to the workflow URL."""
    if n.status == "resolved":
        color = "Good"
    else:
        worst = max(n.firing, key=lambda a: ("info", "warning", "critical").index(a.severity))
        color = COLOR[worst.severity]
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.2",
        "msteams": {"width": "full"},
        "body": [
            {
                "type": "TextBlock",
                "text": truncate(title(n), TITLE_LIMIT),
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
                "style": "heading",
                "color": color,
            },
            # Adaptive Card TextBlocks take a markdown subset where a single newline does not break: use two.
            {
                "type": "TextBlock",
                "text": truncate(body_text(n, bold="**").replace("\n", "\n\n"), TEXT_LIMIT),
                "wrap": True,
            },
        ],
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }
