"""ntfy (ntfy.sh or a self-hosted server): a plain-text message with its title, priority and tags as headers.

Format from ntfy's publishing docs (docs.ntfy.sh/publish): ``POST`` the message text to the topic URL
(``https://ntfy.sh/<topic>``); ``Title``, ``Priority`` (1 min .. 5 max/urgent), ``Tags`` (comma-separated; names
of emoji shortcodes show as emoji in front of the title) and ``Click`` (a URL opened when the notification is
tapped) are request headers. Header values are ASCII on the wire; ntfy decodes RFC 2047 encoded words
(``=?utf-8?b?...?=``), so a non-ASCII title (a host or process name) is sent that way. Messages over 4096 bytes are
turned into attachments by ntfy.sh, or refused by servers without attachments: the text is cut to fit. Access
tokens go in the receiver's ``headers`` (``Authorization: Bearer tk_...``), which are secrets like the URL.
"""

from __future__ import annotations

import json
from email.header import Header
from typing import Any

from gpuwatchd.notify.config import ReceiverConfig
from gpuwatchd.notify.format import body_text, title
from gpuwatchd.notify.integration import Integration, Request, dumps
from gpuwatchd.notify.notification import Notification

MESSAGE_LIMIT_BYTES = 4096  # ntfy's default message-size-limit
HEADER_LIMIT = 1024  # characters of one header value (ntfy's own title limit is far below)
TITLE_LIMIT = 250  # what ntfy's apps show on a line or two; a group's title is short anyway
# severity -> ntfy priority: critical rings through do-not-disturb (5), a resolution stays quiet (2)
PRIORITY = {"critical": 5, "warning": 4, "info": 3, "resolved": 2}
# severity -> emoji shortcode tag (docs.ntfy.sh/emojis)
TAG = {"critical": "rotating_light", "warning": "warning", "info": "information_source",
       "resolved": "white_check_mark"}
CONTENT_TYPE = "text/plain; charset=utf-8"


def _level(n: Notification) -> str:
    if n.status == "resolved":
        return "resolved"
    severities = {a.severity for a in n.firing}
    return next((s for s in ("critical", "warning", "info") if s in severities), "warning")


def render(n: Notification) -> str:
    """The outbox text: the message and its headers' values, as one JSON document."""
    level = _level(n)
    envelope: dict[str, Any] = {
        "title": title(n)[:TITLE_LIMIT],
        "message": body_text(n, bold=""),
        "priority": PRIORITY[level],
        "tags": [TAG[level], *sorted({a.name for a in n.alerts})],
    }
    if n.external_url:
        envelope["click"] = n.external_url.rstrip("/") + "/"  # the daemon's status page
    return dumps(envelope)


def header_value(text: str) -> str:
    """``text`` as one HTTP header value: as is when printable ASCII, else an RFC 2047 encoded word (ntfy decodes).

    The texts come from alert labels (process names, Xid text, dock names): control characters (CR, LF, ESC),
    bidi and zero-width characters become spaces, white space runs become one space and the value is cut to
    :data:`HEADER_LIMIT` characters, so the header is one line. A CR or LF used to reach the encoded word as a
    folded line ("\\n "), which the HTTP client refuses: the notification was retried until it expired.
    """
    text = text[: 4 * HEADER_LIMIT]
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(text) > HEADER_LIMIT:
        text = text[: HEADER_LIMIT - 1] + "…"
    if text.isascii():
        return text
    # Header folds a long value into several encoded words on several lines; on one line, separated by a space,
    # they decode the same (RFC 2047 6.2: white space between adjacent encoded words is ignored).
    return " ".join(Header(text, "utf-8").encode(maxlinelen=10_000).split())


def cut_utf8(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, cut to ``limit`` bytes at a character boundary, marked with an ellipsis when cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return raw
    return raw[: limit - 3].decode(errors="ignore").encode() + "…".encode()


def request(payload: str, _rc: ReceiverConfig, url: str) -> Request:
    """The topic URL, the message as the text body, the rest as ntfy's headers."""
    env = json.loads(payload)
    headers = {
        "Title": header_value(env["title"]),
        "Priority": str(env["priority"]),
        "Tags": header_value(",".join(env["tags"])),
    }
    if env.get("click"):
        headers["Click"] = header_value(env["click"])
    return Request(url, cut_utf8(env["message"], MESSAGE_LIMIT_BYTES), CONTENT_TYPE, headers)


INTEGRATION = Integration(render=render, request=request)
