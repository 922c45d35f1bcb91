"""What one integration owns: the message it renders for the outbox and the HTTP request that carries it.

The dispatcher and the delivery workers know integrations only through this seam (``integration(rc.type)``): a new
receiver type is one module that builds an :class:`Integration`, one entry in ``notify/integrations.py`` and its
name in ``ReceiverType`` (docs/architecture.md, "the recipe for a new notifier").

The outbox keeps ``render``'s text (durable across restarts); ``request`` turns that text back into the body,
content type and headers of the POST at every attempt, so a retry sends exactly what the first attempt sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.notify.config import ReceiverConfig
from gpuwatchd.notify.notification import Notification

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Request:
    """One POST: the body bytes, their content type, the integration's own headers and the URL to post to."""

    url: str
    body: bytes
    content_type: str = JSON
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Integration:
    """One receiver type.

    ``render``: a grouped notification -> the outbox text. ``request``: (outbox text, receiver, member URL) -> the
    POST. ``grouped``: False for a receiver that gets every alert's state pushed instead of grouped messages
    (Alertmanager), which the dispatcher feeds through its own path and whose deliveries are not notifications.
    """

    render: Callable[[Notification], str]
    request: Callable[[str, ReceiverConfig, str], Request]
    grouped: bool = True


def dumps(body: Any) -> str:
    """Compact JSON that keeps non-ASCII text as is (chat services render it)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def json_post(payload: str, _rc: ReceiverConfig, url: str) -> Request:
    """The outbox text is the JSON body, posted as is."""
    return Request(url, payload.encode())


def json_integration(render: Callable[[Notification], Any]) -> Integration:
    """An integration whose message is one JSON document (Slack, Discord, Teams, Mattermost)."""
    return Integration(render=lambda n: dumps(render(n)), request=json_post)
