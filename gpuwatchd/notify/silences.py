"""Silences: matchers plus a time window; an alert matching all matchers of an active silence is not notified.

Same model as Alertmanager's (``startsAt``/``endsAt``, ``createdBy``, ``comment``; expiring sets ``endsAt`` to now),
persisted in the outbox database so a restart keeps them.

Limits beyond Alertmanager's "at least one matcher must not match the empty string": at least one matcher must
narrow the silence down (``alertname=~".+"`` matches any alert as surely as ``.*``), user regexes pass
:func:`matchers.check_regex_safety`, and the API caps live silences and their length (``notify.api``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwatchd.notify.matchers import Matcher, MatchOp, check_regex_safety, matches_all, parse_matcher
from gpuwatchd.notify.outbox import Outbox
from gpuwatchd.notify.webhook import rfc3339

SilenceState = Literal["pending", "active", "expired"]
# Expired silences stay listed this long (Alertmanager keeps them for --data.retention, 120 h).
EXPIRED_RETENTION_SECONDS = 120 * 3600.0
# Matchers per silence: a silence names an alert, a GPU, maybe a process; dozens would be a mistake or an attack.
MAX_MATCHERS = 16
# A value no real label is meant to match: a matcher that accepts it (or "") does not narrow a silence down.
_ANY_VALUE = "gpuwatchd-any-value-7f3c9e1d2b"
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SilenceError(ValueError):
    """A silence refused, with the request field at fault and the HTTP status to answer."""

    def __init__(self, field: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True, slots=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str
    comment: str

    def state(self, now: float) -> SilenceState:
        if now >= self.ends_at:
            return "expired"
        return "active" if now >= self.starts_at else "pending"

    def mutes(self, labels: Mapping[str, str], now: float) -> bool:
        return self.state(now) == "active" and matches_all(self.matchers, labels)


def parse_matchers_json(raw: object, *, max_regex_length: int | None = None) -> tuple[Matcher, ...]:
    """API matchers: strings (``uuid="GPU-1"``) or Alertmanager v2 objects ``{name, value, isRegex, isEqual}``.

    With ``max_regex_length``, regexes must also pass :func:`check_regex_safety` (user input, matched on the loop).
    """
    if not isinstance(raw, list) or not raw:
        raise SilenceError("matchers", "matchers: expected a non-empty list")
    if len(raw) > MAX_MATCHERS:
        raise SilenceError("matchers", f"matchers: at most {MAX_MATCHERS} per silence")
    out = []
    for i, m in enumerate(raw):
        try:
            if isinstance(m, str):
                matcher = parse_matcher(m)
            elif isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("value"), str):
                if not _LABEL_NAME.match(m["name"]):
                    raise ValueError(f"invalid label name {m['name']!r}")
                regex, equal = bool(m.get("isRegex", False)), bool(m.get("isEqual", True))
                op: MatchOp = ("=~" if equal else "!~") if regex else ("=" if equal else "!=")
                matcher = Matcher(m["name"], op, m["value"])
            else:
                raise ValueError("expected a string or {name, value, isRegex, isEqual}")
            if max_regex_length is not None and matcher.op in ("=~", "!~"):
                check_regex_safety(matcher.value, max_regex_length)
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


class Silences:
    """In-memory view of the silences, written through to SQLite."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._items: dict[str, Silence] = {}
        for r in outbox.load_silences():
            ms = tuple(
                parse_matcher(f"{m['name']}{m['op']}{json.dumps(m['value'])}") for m in json.loads(r["matchers"])
            )
            self._items[r["id"]] = Silence(r["id"], ms, r["starts_at"], r["ends_at"], r["created_by"], r["comment"])

    def add(
        self,
        matchers: tuple[Matcher, ...],
        *,
        starts_at: float,
        ends_at: float,
        created_by: str,
        comment: str,
        now: float,
        max_live: int | None = None,
        max_duration: float | None = None,
    ) -> Silence:
        """Create and persist a silence; at most ``max_live`` pending or active, each at most ``max_duration`` s."""
        if ends_at <= starts_at:
            raise SilenceError("endsAt", "endsAt must be after startsAt")
        if ends_at <= now:
            raise SilenceError("endsAt", "endsAt must be in the future")
        if max_duration is not None and ends_at - starts_at > max_duration:
            raise SilenceError(
                "endsAt",
                f"endsAt: a silence may last at most {max_duration / 3600:g} h (notify.api.max_silence_duration)",
            )
        if max_live is not None and sum(s.state(now) != "expired" for s in self._items.values()) >= max_live:
            raise SilenceError(
                None,
                f"silences: {max_live} already pending or active (notify.api.max_silences); expire one first",
                status=409,
            )
        s = Silence(uuid.uuid4().hex, matchers, starts_at, ends_at, created_by, comment)
        self._save(s, now)
        return s

    def expire(self, sid: str, now: float) -> Silence:
        """End a silence now (KeyError if unknown; SilenceError if already expired)."""
        s = self._items[sid]
        if s.state(now) == "expired":
            raise SilenceError("id", "silence already expired", status=409)
        s = Silence(s.id, s.matchers, min(s.starts_at, now), now, s.created_by, s.comment)
        self._save(s, now)
        return s

    def listing(self, now: float) -> list[Silence]:
        """All silences still worth listing, expired ones for ``EXPIRED_RETENTION_SECONDS``."""
        cutoff = now - EXPIRED_RETENTION_SECONDS
        old = [k for k, s in self._items.items() if s.ends_at < cutoff]
        for sid in old:
            del self._items[sid]
        if old:
            self._outbox.delete_silences_before(cutoff)
        return sorted(self._items.values(), key=lambda s: (s.starts_at, s.id))

    def muted_by(self, labels: Mapping[str, str], now: float) -> list[str]:
        """Ids of active silences matching ``labels``."""
        return [s.id for s in self._items.values() if s.mutes(labels, now)]

    def counts(self, now: float) -> dict[str, int]:
        out = {"active": 0, "pending": 0, "expired": 0}
        for s in self._items.values():
            out[s.state(now)] += 1
        return out

    def _save(self, s: Silence, now: float) -> None:
        ms = json.dumps([{"name": m.name, "op": m.op, "value": m.value} for m in s.matchers])
        self._outbox.save_silence(
            s.id, ms, starts_at=s.starts_at, ends_at=s.ends_at, created_by=s.created_by, comment=s.comment, now=now
        )
        self._items[s.id] = s


def silence_json(s: Silence, now: float) -> dict[str, Any]:
    """API form, close to Alertmanager's GettableSilence."""
    return {
        "id": s.id,
        "matchers": [
            {"name": m.name, "value": m.value, "isRegex": m.op in ("=~", "!~"), "isEqual": m.op in ("=", "=~")}
            for m in s.matchers
        ],
        "startsAt": rfc3339(s.starts_at),
        "endsAt": rfc3339(s.ends_at),
        "createdBy": s.created_by,
        "comment": s.comment,
        "status": {"state": s.state(now)},
    }
