"""``POST /api/v1/health/ack``: an operator marks a GPU inspected or replaced (its escalation and failure history
start over, the record is kept); ``GET /api/v1/health/acks`` lists the records. Guarded like the silences API
(``notify.api``: loopback peers only by default, bearer token when set)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from aiohttp import web

from gpuwatchd.notify.api import write_refusal
from gpuwatchd.notify.config import ApiConfig
from gpuwatchd.notify.json_body import BodyError, read_json
from gpuwatchd.remediation.service import ACK_KINDS, MAX_COMMENT_CHARS, AckError, Remediation

MAX_BODY_BYTES = 16 * 1024
BODY_TIMEOUT_SECONDS = 10.0
BODY_KEYS = ("gpu", "kind", "comment", "by")
MAX_FIELD_CHARS = {"gpu": 96, "kind": 16, "comment": MAX_COMMENT_CHARS, "by": 100}


def parse_ack(body: object) -> tuple[str, str, str, str]:
    """(gpu, kind, comment, by) of a request body; AckError naming the field otherwise."""
    if not isinstance(body, dict):
        raise AckError(f"expected a JSON object with {', '.join(BODY_KEYS)}, got {type(body).__name__}")
    unknown = [k for k in body if k not in BODY_KEYS]
    if unknown:
        raise AckError(f"unknown key {str(unknown[0])[:40]!r} (known: {', '.join(BODY_KEYS)})")
    out = []
    for key, default in (("gpu", None), ("kind", "inspected"), ("comment", ""), ("by", "api")):
        v = body.get(key, default)
        if v is None:
            raise AckError(f"{key}: required (a GPU index or UUID)")
        if not isinstance(v, str):
            raise AckError(f"{key}: expected a string, got {type(v).__name__}")
        if len(v) > MAX_FIELD_CHARS[key] or (key in ("gpu", "kind", "by") and not v):
            raise AckError(f"{key}: expected 1..{MAX_FIELD_CHARS[key]} characters")
        out.append(v)
    if out[1] not in ACK_KINDS:
        raise AckError(f"kind: expected one of {', '.join(ACK_KINDS)}")
    return out[0], out[1], out[2], out[3]


def health_routes(remediation: Remediation, api: Callable[[], ApiConfig]) -> list[web.RouteDef]:
    async def ack(request: web.Request) -> web.Response:
        refused = write_refusal(request, api(), "health acknowledgements")
        if refused is not None:
            return refused
        try:
            body = await read_json(request, max_bytes=MAX_BODY_BYTES, timeout=BODY_TIMEOUT_SECONDS)
        except BodyError as e:
            return web.json_response({"error": str(e)}, status=e.status)
        try:
            gpu, kind, comment, by = parse_ack(body)
            return web.json_response(remediation.ack(gpu, kind, comment, by))
        except AckError as e:
            return web.json_response({"error": str(e)}, status=400)

    async def acks(_: web.Request) -> web.Response:
        return web.json_response([asdict(a) for a in remediation.ledger.acks])

    return [web.post("/api/v1/health/ack", ack), web.get("/api/v1/health/acks", acks)]
