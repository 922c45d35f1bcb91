"""Slack incoming webhook: Block Kit blocks plus a ``text`` fallback (used for notifications and old clients).

Limits (Slack docs as quoted in slackapi/bolt-js#2509 and the Block Kit reference): message text is cut at 40 000
characters, a section's text at 3000, a header's at 150, at most 50 blocks. Success is 200 with body ``ok``.
"""

from __future__ import annotations

from typing import Any

from gpuwatchd.notify.format import alert_text, body_text, title, truncate
from gpuwatchd.notify.notification import Notification

TEXT_LIMIT = 40_000
SECTION_TEXT_LIMIT = 3000
HEADER_TEXT_LIMIT = 150
MAX_BLOCKS = 50


def render(n: Notification) -> dict[str, Any]:
    """The JSON body posted to the webhook."""
    head = title(n)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(head, HEADER_TEXT_LIMIT)}}
    ]
    # One section per alert; keep two blocks free for the header and a possible "more" note.
    room = MAX_BLOCKS - 2
    for a in n.alerts[:room]:
        text = truncate(alert_text(a, external_url=n.external_url), SECTION_TEXT_LIMIT)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    if len(n.alerts) > room:
        more = f"…and {len(n.alerts) - room} more alerts"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": more}]})
    fallback = truncate(f"{head}\n\n{body_text(n)}", TEXT_LIMIT)
    return {"text": fallback, "blocks": blocks, "unfurl_links": False, "unfurl_media": False}
