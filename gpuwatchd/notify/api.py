"""HTTP API of alert delivery: ``GET /api/v1/alerts`` and the silences API (create, list, expire).

Shapes follow Alertmanager's API v2 where one exists (silence matchers ``{name, value, isRegex, isEqual}``,
``status.state``, alert ``status.silencedBy/inhibitedBy``); times are RFC 3339 strings. Nothing here ever includes
a receiver URL or token: receivers are named, never described.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpuwatchd.model import Alert
from gpuwatchd.notify.grouping import alert_annotations, alert_fp
from gpuwatchd.notify.silences import parse_matchers_json, silence_json
from gpuwatchd.notify.webhook import rfc3339

if TYPE_CHECKING:
    from gpuwatchd.notify.dispatcher import Dispatcher

log = logging.getLogger(__name__)
# Longest accepted silence comment / author: the API is unauthenticated on loopback; keep rows small.
MAX_TEXT = 2000
# A silence without endsAt lasts this long (amtool's default duration is 1h).
DEFAULT_SILENCE_SECONDS = 3600.0


def _time(value: object, field: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise ValueError(f"{field}: expected an RFC 3339 time or unix seconds")


def _ts(value: float | None) -> str | None:
    return rfc3339(value) if value is not None else None


def alert_json(d: Dispatcher, a: Alert, now: float) -> dict[str, Any]:
    """One alert with its delivery status (silenced/inhibited, receivers)."""
    m = d.muting(a, now)
    state = "suppressed" if m.muted and a.state == "firing" else "active"
    return {
        "fingerprint": alert_fp(a),
        "labels": dict(sorted(a.labels.items())),
        "annotations": alert_annotations(a),
        "state": a.state,
        "value": a.value,
        "activeAt": _ts(a.active_at),
        "firedAt": _ts(a.fired_at),
        "resolvedAt": _ts(a.resolved_at),
        "receivers": [{"name": r} for r in d.receivers_for(a)],
        "status": {"state": state, "silencedBy": list(m.silenced_by), "inhibitedBy": list(m.inhibited_by)},
    }


def build_routes(d: Dispatcher, alerts_provider: Callable[[], Sequence[Alert]]) -> list[web.RouteDef]:
    """The aiohttp route table; the daemon adds it to its app."""

    async def get_alerts(request: web.Request) -> web.Response:
        now = d.now()
        return web.json_response([alert_json(d, a, now) for a in alerts_provider()])

    async def list_silences(request: web.Request) -> web.Response:
        now = d.now()
        return web.json_response([silence_json(s, now) for s in d.silences.listing(now)])

    async def post_silence(request: web.Request) -> web.Response:
        now = d.now()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body: expected a JSON object")
        if not isinstance(body, dict):
            return _error(400, "body: expected a JSON object")
        try:
            matchers = parse_matchers_json(body.get("matchers"))
            starts = _time(body["startsAt"], "startsAt") if "startsAt" in body else now
            ends = _time(body["endsAt"], "endsAt") if "endsAt" in body else starts + DEFAULT_SILENCE_SECONDS
            created_by = str(body.get("createdBy", ""))[:MAX_TEXT]
            comment = str(body.get("comment", ""))[:MAX_TEXT]
            if not created_by:
                raise ValueError("createdBy: required")
            s = d.silences.add(
                matchers, starts_at=starts, ends_at=ends, created_by=created_by, comment=comment, now=now
            )
        except ValueError as e:
            return _error(400, str(e))
        log.info("silence %s created by %s: %s", s.id, s.created_by, ", ".join(str(m) for m in s.matchers))
        d.wake()
        return web.json_response({"silenceID": s.id})

    async def expire_silence(request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        try:
            d.silences.expire(sid, d.now())
        except KeyError:
            return _error(404, f"silence {sid} not found")
        except ValueError as e:
            return _error(409, str(e))
        log.info("silence %s expired", sid)
        d.wake()
        return web.json_response({"silenceID": sid, "status": {"state": "expired"}})

    return [
        web.get("/api/v1/alerts", get_alerts),
        web.get("/api/v1/silences", list_silences),
        web.post("/api/v1/silences", post_silence),
        web.delete("/api/v1/silences/{id}", expire_silence),
    ]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
