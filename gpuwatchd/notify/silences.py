"""Silences: matchers plus a time window; an alert matching all matchers of an active silence is not notified.

Same model as Alertmanager's (``startsAt``/``endsAt``, ``createdBy``, ``comment``; expiring sets ``endsAt`` to now),
persisted in the state database (``store/silences.py``) so a restart keeps them.

Limits beyond Alertmanager's "at least one matcher must not match the empty string": at least one matcher must
narrow the silence down (``alertname=~".+"`` matches any alert as surely as ``.*``), every field is bounded
(:mod:`silence_input`, applied to stored rows as well), and the API caps live silences and their length
(``notify.api``). Regexes run on RE2, in linear time.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwatchd.notify.matchers import Matcher, matches_all
from gpuwatchd.notify.silence_input import (
    MAX_MATCHERS,
    SilenceError,
    check_id,
    check_text,
    check_window,
    make_matcher,
)
from gpuwatchd.notify.store import SilenceStore
from gpuwatchd.notify.webhook import rfc3339

log = logging.getLogger(__name__)

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


class Silences:
    """In-memory view of the silences, written through to SQLite."""

    def __init__(self, store: SilenceStore) -> None:
        self._store = store
        self._items: dict[str, Silence] = {}
        self.skipped = 0  # stored rows that did not pass validation at load
        for r in store.rows():
            try:
                s = silence_from_row(r)
            except (SilenceError, ValueError, TypeError, KeyError, IndexError) as e:
                # One bad row (older version, damage, a pattern RE2 refuses) must not hide the others or break
                # every later listing: skip it, once, and say which.
                self.skipped += 1
                store.count_skipped()
                log.warning("silences: skipped stored silence %.64r: %s", _row_id(r), e)
                continue
            self._items[s.id] = s

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
        check_window(starts_at, ends_at, now)
        check_text(created_by, "createdBy")
        check_text(comment, "comment")
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
            self._store.delete_ended_before(cutoff)
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
        self._store.save(
            s.id, ms, starts_at=s.starts_at, ends_at=s.ends_at, created_by=s.created_by, comment=s.comment, now=now
        )
        self._items[s.id] = s


def silence_from_row(r: Any) -> Silence:
    """A stored silence, held to the API's rules (SilenceError/ValueError if it does not pass them)."""
    sid = r["id"]
    if not isinstance(sid, str):
        raise ValueError("id: not a string")
    check_id(sid)
    raw = json.loads(r["matchers"])
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MATCHERS:
        raise ValueError(f"matchers: expected 1 to {MAX_MATCHERS}")
    matchers = tuple(make_matcher(str(m["name"]), str(m["op"]), str(m["value"])) for m in raw)
    starts, ends = r["starts_at"], r["ends_at"]
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (starts, ends)):
        raise ValueError("startsAt/endsAt: not numbers")
    check_window(float(starts), float(ends))
    texts = [r["created_by"], r["comment"]]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("createdBy/comment: not strings")
    return Silence(
        sid, matchers, float(starts), float(ends), check_text(texts[0], "createdBy"), check_text(texts[1], "comment")
    )


def _row_id(r: Any) -> object:
    try:
        return r["id"]
    except (KeyError, IndexError):
        return None


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
