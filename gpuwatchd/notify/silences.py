"""Silences: matchers plus a time window; an alert matching all matchers of an active silence is not notified.

Same model as Alertmanager's (``startsAt``/``endsAt``, ``createdBy``, ``comment``; expiring sets ``endsAt`` to now),
persisted in the outbox database so a restart keeps them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwatchd.notify.matchers import Matcher, MatchOp, matches_all, parse_matcher
from gpuwatchd.notify.outbox import Outbox
from gpuwatchd.notify.webhook import rfc3339

SilenceState = Literal["pending", "active", "expired"]
# Expired silences stay listed this long (Alertmanager keeps them for --data.retention, 120 h).
EXPIRED_RETENTION_SECONDS = 120 * 3600.0


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


def parse_matchers_json(raw: object) -> tuple[Matcher, ...]:
    """API matchers: strings (``uuid="GPU-1"``) or Alertmanager v2 objects ``{name, value, isRegex, isEqual}``."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("matchers: expected a non-empty list")
    out = []
    for i, m in enumerate(raw):
        try:
            if isinstance(m, str):
                out.append(parse_matcher(m))
            elif isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("value"), str):
                regex, equal = bool(m.get("isRegex", False)), bool(m.get("isEqual", True))
                op: MatchOp = ("=~" if equal else "!~") if regex else ("=" if equal else "!=")
                out.append(Matcher(m["name"], op, m["value"]))
            else:
                raise ValueError("expected a string or {name, value, isRegex, isEqual}")
        except ValueError as e:
            raise ValueError(f"matchers[{i}]: {e}") from None
    return tuple(out)


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
    ) -> Silence:
        """Create and persist a silence."""
        if ends_at <= starts_at:
            raise ValueError("endsAt must be after startsAt")
        if ends_at <= now:
            raise ValueError("endsAt must be in the future")
        s = Silence(uuid.uuid4().hex, matchers, starts_at, ends_at, created_by, comment)
        self._save(s, now)
        return s

    def expire(self, sid: str, now: float) -> Silence:
        """End a silence now (KeyError if unknown; ValueError if already expired)."""
        s = self._items[sid]
        if s.state(now) == "expired":
            raise ValueError("silence already expired")
        s = Silence(s.id, s.matchers, min(s.starts_at, now), now, s.created_by, s.comment)
        self._save(s, now)
        return s

    def listing(self, now: float) -> list[Silence]:
        """All silences still worth listing, expired ones for ``EXPIRED_RETENTION_SECONDS``."""
        cutoff = now - EXPIRED_RETENTION_SECONDS
        for sid in [k for k, s in self._items.items() if s.ends_at < cutoff]:
            del self._items[sid]
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
