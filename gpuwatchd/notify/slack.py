"""Slack incoming webhook: Block Kit blocks plus a ``text`` fallback (used for notifications and old clients).

Text in ``mrkdwn`` (the sections, the context note and the ``text`` fallback) has ``&``, ``<`` and ``>`` escaped as
Slack's "Escaping text" asks: unescaped, a process name ``<!channel>`` pinged the whole channel and
``<https://evil|details>`` made a link that says something else than where it goes. The header is ``plain_text``.

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


def escape(text: str) -> str:
    """``text`` for a ``mrkdwn`` field: the three characters Slack reads as control sequences, as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(n: Notification) -> dict[str, Any]:
    """The JSON body posted to the webhook."""
    head = title(n)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(head, HEADER_TEXT_LIMIT)}}
    ]
    # One section per alert; keep two blocks free for the header and a possible "more" note.
    room = MAX_BLOCKS - 2
    for a in n.alerts[:room]:
        text = _cut_escaped(alert_text(a, external_url=n.external_url), SECTION_TEXT_LIMIT)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    if len(n.alerts) > room:
        more = f"…and {len(n.alerts) - room} more alerts"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": more}]})
    fallback = _cut_escaped(f"{head}\n\n{body_text(n)}", TEXT_LIMIT)
    return {"text": fallback, "blocks": blocks, "unfurl_links": False, "unfurl_media": False}


def _cut_escaped(text: str, limit: int) -> str:
    """``text`` escaped, at most ``limit`` characters, never cut inside an entity."""
    out = escape(text)
    if len(out) <= limit:
        return out
    cut = truncate(out, limit)
    amp = cut.rfind("&", max(0, len(cut) - 6))
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp] + cut[-1]  # drop the half entity, keep the ellipsis
    return cut
