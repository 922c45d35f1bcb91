"""HTTP API of alert delivery: ``GET /api/v1/alerts`` and the silences API (create, list, expire).

Shapes follow Alertmanager's API v2 where one exists (silence matchers ``{name, value, isRegex, isEqual}``,
``status.state``, alert ``status.silencedBy/inhibitedBy``); times are RFC 3339 strings. Nothing here ever includes
a receiver URL or token: receivers are named, never described.

Reading is open (like ``/metrics``); writing (create, expire) is guarded by ``notify.api``: loopback peers only by
default, and a bearer token when ``write_token`` is set. The peer is the TCP peer: a reverse proxy on this host
makes every request local, so put the token on when one is in front.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpuwatchd.model import Alert
from gpuwatchd.notify.config import ApiConfig, Member
from gpuwatchd.notify.cross_site import JSON_CONTENT_TYPE_ERROR, cross_site_reason, json_content_type
from gpuwatchd.notify.fingerprints import alert_fp
from gpuwatchd.notify.json_body import BodyError, read_json
from gpuwatchd.notify.notification import alert_annotations
from gpuwatchd.notify.peer import is_loopback
from gpuwatchd.notify.silence_form import form_routes
from gpuwatchd.notify.silence_input import SilenceError, check_id, parse_matchers_json, parse_text, parse_time
from gpuwatchd.notify.silences import silence_json
from gpuwatchd.notify.webhook import rfc3339

if TYPE_CHECKING:
    from gpuwatchd.notify.dispatcher import Dispatcher

log = logging.getLogger(__name__)
# Largest silence request body: 16 matchers of 256-character regexes plus texts fit in a tenth of this.
MAX_BODY_BYTES = 64 * 1024
# A silence body must arrive within this time once its headers have: a client dribbling it holds a handler.
BODY_TIMEOUT_SECONDS = 10.0
# A silence without endsAt lasts this long (amtool's default duration is 1h).
DEFAULT_SILENCE_SECONDS = 3600.0
# Retry-After of a receiver test refused because every receiver asked for is at its rate limit.
RATE_LIMITED_RETRY_AFTER_SECONDS = 60


class _RefusalLog:
    """Refused writes as warnings, at most ``BURST`` a minute: anyone who reaches the port can send them."""

    BURST = 10
    WINDOW_SECONDS = 60.0

    def __init__(self) -> None:
        self._window_start = -self.WINDOW_SECONDS
        self._count = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= self.WINDOW_SECONDS:
            if self._count > self.BURST:
                log.warning("silences: %d more writes refused in the last minute", self._count - self.BURST)
            self._window_start, self._count = now, 0
        self._count += 1
        log.log(logging.WARNING if self._count <= self.BURST else logging.DEBUG, msg, *args)


_refusals = _RefusalLog()


def write_refusal(
    request: web.Request, api: ApiConfig, what: str = "silences", external_url: str = ""
) -> web.Response | None:
    """The error answer if ``request`` may not change silences (or run ``what``: probes), else None.

    First, whatever the auth: a request from a page of another origin, or naming a host that is not this daemon
    (DNS rebinding), is refused (``cross_site.py``); a browser on this host is a loopback peer.
    """
    crossed = cross_site_reason(request, external_url)
    if crossed is not None:
        header, why = crossed
        _refusals.warning("%s: refused a cross-site write from %s (%s)", what, request.remote, header)
        return _error(403, f"{what}: refused: {why}", header)
    if api.write_from_loopback_only and not is_loopback(request.remote):
        _refusals.warning("%s: refused a write from %s (not loopback)", what, request.remote)
        verb = "changed" if what == "silences" else "run"
        return _error(
            403,
            f"{what} can be {verb} from this host only (notify.api.write_from_loopback_only)",
            "remote",
        )
    if api.write_token is not None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        expected = api.write_token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            _refusals.warning("%s: refused a write from %s (missing or wrong token)", what, request.remote)
            resp = _error(401, "Authorization: expected Bearer <notify.api.write_token>", "Authorization")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="gpuwatchd"'
            return resp
    return None


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
        resp = web.json_response([alert_json(d, a, now) for a in alerts_provider()])
        # A fleet's worth of alerts (one per GPU and process) is tens of kB of JSON, polled every few seconds by the
        # status page: gzip when the client asks for it, as /api/v1/status does.
        resp.enable_compression()
        return resp

    async def list_silences(request: web.Request) -> web.Response:
        now = d.now()
        resp = web.json_response([silence_json(s, now) for s in d.silences.listing(now)])
        resp.enable_compression()
        return resp

    async def post_silence(request: web.Request) -> web.Response:
        api = d.config.api
        refused = write_refusal(request, api, external_url=d.config.external_url)
        if refused is not None:
            return refused
        now = d.now()
        try:
            body = await read_json(request, max_bytes=MAX_BODY_BYTES, timeout=BODY_TIMEOUT_SECONDS)
        except BodyError as e:
            return _error(e.status, str(e), "body")
        if not json_content_type(request):
            return _error(415, JSON_CONTENT_TYPE_ERROR, "Content-Type")
        if not isinstance(body, dict):
            return _error(400, "body: expected a JSON object", "body")
        try:
            matchers = parse_matchers_json(body.get("matchers"), max_regex_length=api.max_regex_length)
            starts = parse_time(body["startsAt"], "startsAt") if "startsAt" in body else now
            ends = parse_time(body["endsAt"], "endsAt") if "endsAt" in body else starts + DEFAULT_SILENCE_SECONDS
            created_by = parse_text(body, "createdBy")
            comment = parse_text(body, "comment")
            if not created_by:
                raise SilenceError("createdBy", "createdBy: required")
            s = d.silences.add(
                matchers,
                starts_at=starts,
                ends_at=ends,
                created_by=created_by,
                comment=comment,
                now=now,
                max_live=api.max_silences,
                max_duration=api.max_silence_duration,
            )
        except SilenceError as e:
            return _error(e.status, str(e), e.field)
        log.info("silence %s created by %.80r: %s", s.id, s.created_by, ", ".join(str(m) for m in s.matchers))
        d.wake()
        return web.json_response({"silenceID": s.id})

    async def expire_silence(request: web.Request) -> web.Response:
        refused = write_refusal(request, d.config.api, external_url=d.config.external_url)
        if refused is not None:
            return refused
        sid = request.match_info["id"]
        try:
            check_id(sid)
            d.silences.expire(sid, d.now())
        except KeyError:
            return _error(404, f"silence {sid!r} not found", "id")
        except SilenceError as e:
            return _error(e.status, str(e), e.field)
        log.info("silence %s expired", sid)
        d.wake()
        return web.json_response({"silenceID": sid, "status": {"state": "expired"}})

    async def test_receivers(request: web.Request) -> web.Response:
        # `gpuwatchd notify test --url`: the running daemon's receivers, as its config has them now. Guarded like a
        # silence write: it makes the daemon post to every receiver.
        refused = write_refusal(request, d.config.api, "receiver tests", d.config.external_url)
        if refused is not None:
            return refused
        from gpuwatchd.notify.receiver_test import send_tests

        names = request.query.getall("receiver", [])
        receivers = [r for r in d.config.receivers if not names or r.name in names]
        unknown = sorted(set(names) - {r.name for r in d.config.receivers})
        if unknown:
            return _error(404, f"unknown receiver {unknown[0]!r}", "receiver")
        limited = 0

        def reserve(member: Member) -> float:
            nonlocal limited
            wait = d.reserve_send(member)
            limited += wait > 0
            return wait

        results = await send_tests(d.config, receivers, d.host, reserve)
        lines = [{"line": line, "ok": ok} for line, ok in results]
        if results and limited == len(results):
            resp = web.json_response({"error": "every receiver asked for is at its rate limit (tests count against"
                                      " notify.receivers[].rate_limit_per_minute); try again later",
                                      "field": "receiver", "results": lines}, status=429)
            resp.headers["Retry-After"] = str(RATE_LIMITED_RETRY_AFTER_SECONDS)
            return resp
        return web.json_response({"results": lines})

    return [
        web.post("/api/v1/receivers/test", test_receivers),
        web.get("/api/v1/alerts", get_alerts),
        web.get("/api/v1/silences", list_silences),
        web.post("/api/v1/silences", post_silence),
        web.delete("/api/v1/silences/{id}", expire_silence),
        *form_routes(d),  # the chat messages' silence link (notify.external_url)
    ]


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    """A 4xx answer: ``{"error": message, "field": the request field at fault or null}``."""
    return web.json_response({"error": message, "field": field}, status=status)
