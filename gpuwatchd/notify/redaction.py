"""Keep webhook URLs and tokens out of every text we produce (logs, errors, API, metrics).

For Slack, Discord, Teams Workflows and most chat webhooks the URL *is* the credential (Alertmanager redacts them
with ``notify.RedactURL``). aiohttp puts the URL in many exception messages, so every exception text passes
through :func:`redact` before it is logged or stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

REDACTED = "<redacted>"
# Secret fragments shorter than this are not scrubbed piecemeal: replacing "/" or "a" would garble every message.
MIN_FRAGMENT = 6


def secret_fragments(secrets: Iterable[str]) -> list[str]:
    """Each secret plus, for URLs, its path and query (which carry the token); longest first."""
    out: set[str] = set()
    for s in secrets:
        if not s:
            continue
        out.add(s)
        parts = urlsplit(s)
        if parts.scheme and parts.netloc:
            for frag in (parts.path, parts.query, f"{parts.path}?{parts.query}", parts.netloc + parts.path):
                if len(frag) >= MIN_FRAGMENT:
                    out.add(frag)
            if parts.password:
                out.add(parts.password)
    return sorted(out, key=len, reverse=True)


def redact(text: str, fragments: Iterable[str]) -> str:
    """``text`` with every fragment replaced by ``<redacted>``."""
    for f in fragments:
        if f and f in text:
            text = text.replace(f, REDACTED)
    return text


def describe_error(exc: BaseException, fragments: Iterable[str]) -> str:
    """A short, secret-free description of a transport error: ``ClientConnectorError: Cannot connect...``."""
    detail = redact(str(exc), fragments)
    name = type(exc).__name__
    return f"{name}: {detail}" if detail else name
