"""Validation of every field of a silence, for the API (a request body) and for the database (a stored row).

The same rules on both sides, so that nothing the API accepts can break a later read, and a row that does not pass
(written by an older version, or damaged) is skipped instead of breaking every ``GET /api/v1/silences`` after it.
Matcher regexes are compiled with RE2 (:mod:`matchers`): linear-time matching whatever the pattern.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpuwatchd.notify.matchers import Matcher, MatchOp, check_regex_length, parse_matcher

# Matchers per silence: a silence names an alert, a GPU, maybe a process; dozens would be a mistake or an attack.
MAX_MATCHERS = 16
# Longest label name and literal matcher value: real label values (UUIDs, process names, paths) fit easily.
MAX_NAME_LENGTH = 128
MAX_VALUE_LENGTH = 1024
# Longest silence comment / author: keep rows small (a ticket link and a sentence fit easily).
MAX_TEXT = 2000
# Silence ids are uuid4 hex (32 characters); anything longer is not ours.
MAX_ID_LENGTH = 64
# Times a silence may carry: 2000-01-01 to 2100-01-01 UTC. Every one renders as RFC 3339 (``datetime`` stops at
# year 9999, NaN and infinities not at all, and they would turn every later listing into a 500).
MIN_TIME = 946_684_800.0
MAX_TIME = 4_102_444_800.0
# How far ahead a silence may start: planned maintenance is days or weeks ahead, not years.
MAX_START_AHEAD_SECONDS = 366 * 86400.0
# A value no real label is meant to match: a matcher that accepts it (or "") does not narrow a silence down.
_ANY_VALUE = "gpuwatchd-any-value-7f3c9e1d2b"
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REGEX_OPS = ("=~", "!~")


class SilenceError(ValueError):
    """A silence refused, with the request field at fault and the HTTP status to answer."""

    def __init__(self, field: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def parse_time(value: object, field: str) -> float:
    """An RFC 3339 time with a zone (``2026-05-01T10:00:00Z``) or unix seconds, finite and in range."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        t = float(value)
    elif isinstance(value, str) and len(value) <= 64:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise SilenceError(field, f"{field}: expected an RFC 3339 time or unix seconds") from None
        if parsed.tzinfo is None:
            raise SilenceError(field, f"{field}: expected an RFC 3339 time with a zone (Z or +hh:mm)")
        t = parsed.timestamp()
    else:
        raise SilenceError(field, f"{field}: expected an RFC 3339 time or unix seconds")
    if not math.isfinite(t):
        raise SilenceError(field, f"{field}: expected a finite time")
    return t


def check_window(starts: float, ends: float, now: float | None = None) -> None:
    """``endsAt`` after ``startsAt``, both between 2000 and 2100; with ``now``, a start at most a year ahead."""
    if not (math.isfinite(starts) and math.isfinite(ends)):
        raise SilenceError("startsAt", "startsAt/endsAt: expected finite times")
    if ends <= starts:
        raise SilenceError("endsAt", "endsAt must be after startsAt")
    for field, t in (("startsAt", starts), ("endsAt", ends)):
        if not MIN_TIME <= t <= MAX_TIME:
            raise SilenceError(field, f"{field}: expected a time between 2000-01-01 and 2100-01-01")
    if now is not None and starts > now + MAX_START_AHEAD_SECONDS:
        raise SilenceError("startsAt", "startsAt: at most a year ahead")


def parse_text(body: Mapping[str, Any], field: str) -> str:
    """An optional string field, at most ``MAX_TEXT`` characters."""
    value = body.get(field, "")
    if not isinstance(value, str):
        raise SilenceError(field, f"{field}: expected a string")
    return check_text(value, field)


def check_text(value: str, field: str) -> str:
    if len(value) > MAX_TEXT:
        raise SilenceError(field, f"{field}: longer than {MAX_TEXT} characters")
    return value


def _matcher_from_object(m: Mapping[str, Any]) -> Matcher:
    name, value = m.get("name"), m.get("value")
    if not isinstance(name, str) or not isinstance(value, str):
        raise ValueError("expected a string or {name, value, isRegex, isEqual}")
    regex, equal = m.get("isRegex", False), m.get("isEqual", True)
    if not isinstance(regex, bool) or not isinstance(equal, bool):
        raise ValueError("isRegex and isEqual: expected true or false")
    return make_matcher(name, ("=~" if equal else "!~") if regex else ("=" if equal else "!="), value)


def make_matcher(name: str, op: str, value: str, max_regex_length: int | None = None) -> Matcher:
    """A matcher from its parts, every part checked (name, op, value length); regexes compiled by RE2."""
    if len(name) > MAX_NAME_LENGTH or not _LABEL_NAME.match(name):
        raise ValueError(f"invalid label name {name[:MAX_NAME_LENGTH]!r}")
    if op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"invalid operator {op[:8]!r}")
    if op in _REGEX_OPS and max_regex_length is not None:
        check_regex_length(value, max_regex_length)
    if len(value) > MAX_VALUE_LENGTH:
        raise ValueError(f"value longer than {MAX_VALUE_LENGTH} characters")
    matcher_op: MatchOp = op  # type: ignore[assignment]  # checked against the four ops just above
    return Matcher(name, matcher_op, value)


def parse_matchers_json(raw: object, *, max_regex_length: int | None = None) -> tuple[Matcher, ...]:
    """API matchers: strings (``uuid="GPU-1"``) or Alertmanager v2 objects ``{name, value, isRegex, isEqual}``.

    With ``max_regex_length``, regexes are also held to that length (``notify.api.max_regex_length``).
    """
    if not isinstance(raw, list) or not raw:
        raise SilenceError("matchers", "matchers: expected a non-empty list")
    if len(raw) > MAX_MATCHERS:
        raise SilenceError("matchers", f"matchers: at most {MAX_MATCHERS} per silence")
    out = []
    for i, m in enumerate(raw):
        try:
            if isinstance(m, str):
                if len(m) > MAX_NAME_LENGTH + MAX_VALUE_LENGTH + 8:
                    raise ValueError("matcher text too long")
                parsed = parse_matcher(m)
                matcher = make_matcher(parsed.name, parsed.op, parsed.value, max_regex_length)
            elif isinstance(m, dict):
                if max_regex_length is not None and m.get("isRegex") is True and isinstance(m.get("value"), str):
                    check_regex_length(m["value"], max_regex_length)
                matcher = _matcher_from_object(m)
            else:
                raise ValueError("expected a string or {name, value, isRegex, isEqual}")
        except ValueError as e:
            raise SilenceError(f"matchers[{i}]", f"matchers[{i}]: {e}") from None
        out.append(matcher)
    if all(_open_ended(m) for m in out):
        raise SilenceError(
            "matchers",
            "matchers: none narrows the silence down (each matches an empty or any value), so it would mute every"
            ' alert; add one like alertname="GpuThrottled" or uuid="GPU-..."',
        )
    return tuple(out)


def _open_ended(m: Matcher) -> bool:
    """Matches the empty string (Alertmanager's test) or an arbitrary value (``=~".+"``, ``!="x"``)."""
    return m.matches({}) or m.matches({m.name: _ANY_VALUE})


def check_id(sid: str) -> None:
    if not sid or len(sid) > MAX_ID_LENGTH or not sid.isascii() or not sid.isalnum():
        raise SilenceError("id", "id: expected a silence id")
