"""Keeping a notification under the outbox's size cap (``store.database.MAX_PAYLOAD_BYTES``): a group (or an
Alertmanager push) with more alerts than fit is rendered with the first ones only (sorted: most severe first),
halving until it fits. What is left out is still in the group's state and in ``/api/v1/alerts``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuwatchd.notify.store.database import MAX_PAYLOAD_BYTES

log = logging.getLogger(__name__)
T = TypeVar("T")


def fits(payload: str) -> bool:
    return len(payload.encode("utf-8", "surrogatepass")) <= MAX_PAYLOAD_BYTES


def render_capped(items: Sequence[T], render: Callable[[Sequence[T]], str], what: str) -> str | None:
    """``render(items)``, or of its first half, quarter... until it fits; None when not even one item does."""
    n = len(items)
    while n >= 1:
        payload = render(items[:n])
        if fits(payload):
            if n < len(items):
                log.warning("%s: %d of %d alerts left out of the message to keep it under %d bytes", what,
                            len(items) - n, len(items), MAX_PAYLOAD_BYTES)  # fmt: skip
            return payload
        n //= 2
    log.error("%s: not sent: a message with a single alert is over %d bytes", what, MAX_PAYLOAD_BYTES)
    return None
