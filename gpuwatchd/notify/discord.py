"""Discord webhook: a ``content`` line plus one embed per alert.

Limits (discord-api-docs message.mdx "Embed Limits", webhook.mdx): content 2000, 10 embeds, embed title 256,
description 4096, and 6000 characters summed over all embeds. 429 carries ``retry_after`` in the JSON body
(handled in ``retry``). ``allowed_mentions`` is emptied so a process named ``@everyone`` pings nobody.
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.notify.format import alert_text, title, truncate
from gpuwatchd.notify.notification import Notification

CONTENT_LIMIT = 2000
MAX_EMBEDS = 10
EMBED_TITLE_LIMIT = 256
EMBED_DESCRIPTION_LIMIT = 4096
EMBEDS_TOTAL_LIMIT = 6000
COLORS = {"critical": 0xD32F2F, "warning": 0xF9A825, "info": 0x1976D2, "resolved": 0x2E7D32}


def render(n: Notification) -> dict[str, Any]:
    """The JSON body posted to the webhook."""
    embeds: list[dict[str, Any]] = []
    budget = EMBEDS_TOTAL_LIMIT
    shown = n.alerts[:MAX_EMBEDS]
    for i, a in enumerate(shown):
        rest = len(n.alerts) - MAX_EMBEDS
        note = f"\n\n…and {rest} more alerts" if i == len(shown) - 1 and rest > 0 else ""
        head = truncate(f"{'RESOLVED' if a.state == 'resolved' else a.severity.upper()}: {a.name}", EMBED_TITLE_LIMIT)
        text = alert_text(a, bold="**", external_url=n.external_url)
        desc = truncate(text, EMBED_DESCRIPTION_LIMIT - len(note)) + note
        if len(head) + len(desc) > budget:
            desc = truncate(desc, budget - len(head))
        if budget - len(head) <= 0 or not desc:
            break
        budget -= len(head) + len(desc)
        color = COLORS["resolved" if a.state == "resolved" else a.severity]
        embeds.append({"title": head, "description": desc, "color": color})
    return {"content": truncate(title(n), CONTENT_LIMIT), "embeds": embeds, "allowed_mentions": {"parse": []}}
