"""Mattermost incoming webhook: Markdown ``text`` (Mattermost >= 5.0 accepts 16383 characters; Alertmanager cuts
there too). Success is 200 with body ``ok``."""

from __future__ import annotations

from typing import Any

from gpuwatchd.notify.format import body_text, title, truncate
from gpuwatchd.notify.notification import Notification

TEXT_LIMIT = 16_383


def render(n: Notification) -> dict[str, Any]:
    """The JSON body posted to the webhook."""
    text = f"#### {title(n)}\n{body_text(n, bold='**')}"
    return {"text": truncate(text, TEXT_LIMIT)}
