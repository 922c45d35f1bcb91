"""Keep webhook URLs and tokens out of every text we produce (logs, errors, API, metrics, the database).

For Slack, Discord, Teams Workflows and most chat webhooks the URL *is* the credential (Alertmanager redacts them
with ``notify.RedactURL``); header values (``Authorization: Bearer ...``) and HMAC keys are secrets too. Text that
comes back from a remote service (an error body, an exception message naming the URL) can carry a secret in
another form than the one configured: an echoed header without its ``Bearer `` prefix, the credentials of a
``Basic`` header decoded, a URL re-quoted by the HTTP library (``%20`` for a space, ``%C3%A9`` for ``é``, upper or
lower case hex, ``+`` for a space), a host in IDNA form, a token JSON-escaped by the service (``\\/``, ``\\u00e9``).
:func:`secret_fragments` derives every such form once per receiver, and :func:`redact` replaces them all, ignoring
case, before a text is logged or stored.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlsplit

from yarl import URL

REDACTED = "<redacted>"
# Secret fragments shorter than this are not scrubbed piecemeal: replacing "/" or "a" would garble every message.
MIN_FRAGMENT = 6
# URL path segments are scrubbed one by one when they look like tokens: this long, or holding a digit, an escape,
# a space or a non-ASCII character ("services", "webhooks" stay readable).
TOKEN_SEGMENT = 12
# Authorization schemes whose value follows the scheme name.
_PATH_SAFE = "!$&'()*+,;=:@/"
_QUERY_SAFE = "!$'()*,;:@/?"
_SCHEMES = re.compile(r"^\s*(bearer|basic|token|bot|apikey|api-key|key|splunk|digest)\s+(.+?)\s*$", re.IGNORECASE)


def _encodings(text: str) -> set[str]:
    """``text`` as it may come back: raw, percent-encoded (path-safe or fully, ``+`` for space) and decoded, and
    JSON-escaped."""
    forms = {text, quote(text, safe=""), quote_plus(text, safe=""), quote_plus(text)}
    # What a path or a query may keep unescaped (RFC 3986 sub-delims): HTTP libraries differ in what they escape.
    forms |= {quote(text, safe=safe) for safe in (_PATH_SAFE, "/:@", _QUERY_SAFE)}
    forms |= {unquote(text), unquote_plus(text)}
    for f in list(forms):
        forms.add(json.dumps(f)[1:-1])
        forms.add(json.dumps(f, ensure_ascii=False)[1:-1])
    return forms


def _url_forms(url: str) -> set[str]:
    """The pieces of a URL that carry its token, in every form an HTTP library or a service may print them."""
    out: set[str] = set()
    parts = urlsplit(url)
    if not (parts.scheme and parts.netloc):
        return out
    for frag in (parts.path, parts.query, f"{parts.path}?{parts.query}", parts.netloc + parts.path):
        out.add(frag)
    if parts.password:
        out.add(parts.password)
    if parts.username and parts.password:
        out.add(f"{parts.username}:{parts.password}")
    out |= {v for _, v in parse_qsl(parts.query, keep_blank_values=True)}
    for seg in parts.path.split("/"):
        plain = unquote(seg)
        if len(seg) >= TOKEN_SEGMENT or any(c.isdigit() or c in "% +" or not c.isascii() for c in seg + plain):
            out.add(seg)
            out.add(plain)
    try:
        normal = URL(url)  # what aiohttp sends and prints: yarl's quoting and IDNA host
        out |= {str(normal), normal.raw_path, normal.path, normal.raw_query_string, normal.query_string}
        out |= {normal.raw_path_qs, normal.path_qs}
        if normal.raw_host:
            out.add(f"{normal.raw_host}{normal.raw_path}")
        out |= set(normal.query.values())
    except (ValueError, TypeError, UnicodeError):
        pass
    if parts.hostname:
        try:
            idna_host = parts.hostname.encode("idna").decode("ascii")
            out.add(idna_host + parts.path)
        except UnicodeError:
            pass
    return out


def _header_forms(value: str) -> set[str]:
    """A header value with and without its scheme, and the decoded credentials of a Basic value."""
    out = {value}
    m = _SCHEMES.match(value)
    if m:
        scheme, credential = m.group(1).lower(), m.group(2)
        out.add(credential)
        if scheme == "basic":
            try:
                decoded = base64.b64decode(credential, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            if decoded:
                out.add(decoded)
                _, sep, password = decoded.partition(":")
                if sep:
                    out.add(password)
    return out


def secret_fragments(secrets: Iterable[str]) -> list[str]:
    """Every form of every secret worth scrubbing (see module docstring); longest first."""
    found: set[str] = set()
    for s in secrets:
        if not s:
            continue
        forms = _header_forms(s) | _url_forms(s)
        for f in list(forms):
            forms |= _encodings(f)
        found |= {f for f in forms if len(f) >= MIN_FRAGMENT}
    return sorted(found, key=lambda f: (-len(f), f))


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def _pattern(fragments: Iterable[str]) -> re.Pattern[str] | None:
    key = tuple(fragments)
    if not key:
        return None
    pattern = _PATTERNS.get(key)
    if pattern is None:
        if len(_PATTERNS) >= 64:  # one entry per receiver; bound what a reload loop can leave behind
            _PATTERNS.clear()
        # Longest first, so a whole URL is replaced before its path; case-insensitive (hex escapes, hosts).
        ordered = sorted(set(key), key=len, reverse=True)
        pattern = _PATTERNS[key] = re.compile("|".join(re.escape(f) for f in ordered), re.IGNORECASE)
    return pattern


def redact(text: str, fragments: Iterable[str]) -> str:
    """``text`` with every fragment (any case) replaced by ``<redacted>``."""
    pattern = _pattern(fragments)
    if pattern is None or not text:
        return text
    return pattern.sub(REDACTED, text)


def describe_error(exc: BaseException, fragments: Iterable[str]) -> str:
    """A short, secret-free description of a transport error: ``ClientConnectorError: Cannot connect...``."""
    detail = redact(str(exc), fragments)
    name = type(exc).__name__
    return f"{name}: {detail}" if detail else name
