"""Fetch a running daemon's status and alerts over HTTP (``gpuwatchd status``, ``status --watch`` and ``doctor``)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from gpuwatchd.runtime.daemon_client import AUTH_HINT, ClientSetupError, DaemonClient, tls_problem
from gpuwatchd.runtime.json_answer import (
    MAX_ANSWER_BYTES,
    STATUS_SHAPE,
    AnswerError,
    Shape,
    check_shape,
    not_gpuwatchd,
    read_answer,
)

# An alert as the clients read it (labels, annotations, status are objects when present).
ALERT_SHAPE: Shape = {"labels": dict, "annotations": dict, "status": dict}


class StatusUnavailable(Exception):
    """No daemon answered at the URL (or it answered something that is not gpuwatchd's status API)."""


class DaemonRefused(StatusUnavailable):
    """A daemon answers at the URL but refused us: HTTP 401/403, or the TLS handshake failed."""


async def fetch_status(base_url: str, *, timeout: float = 5.0,
                       client: DaemonClient | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """GET ``/api/v1/status`` and ``/api/v1/alerts``, both within ``timeout`` seconds in all; raises
    :class:`StatusUnavailable` with a readable reason (one line) for no answer, a refusal, or an answer that is not
    a gpuwatchd status (too large, too deep, not JSON, not the shape the commands read: runtime/json_answer.py).
    ``client``: TLS trust and basic auth for a daemon with a web config (runtime/daemon_client.py)."""
    t = aiohttp.ClientTimeout(total=timeout)
    try:
        args = (client or DaemonClient()).session_args()
    except ClientSetupError as e:
        raise StatusUnavailable(str(e)) from None

    async def both() -> tuple[Any, Any]:
        async with aiohttp.ClientSession(timeout=t, **args) as session:
            return (await _get_json(session, f"{base_url}/api/v1/status", base_url, "status"),
                    await _get_json(session, f"{base_url}/api/v1/alerts", base_url, "alert list"))

    try:
        status, alerts_doc = await asyncio.wait_for(both(), timeout)  # the deadline of the two requests in all
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        problem = tls_problem(base_url, e)
        if problem is not None:
            raise DaemonRefused(f"no gpuwatchd reachable at {base_url}: {problem}") from None
        reason = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e) or type(e).__name__
        raise StatusUnavailable(f"no gpuwatchd reachable at {base_url}: {reason}") from None
    problem = check_shape(status, STATUS_SHAPE)
    if problem is not None:
        raise StatusUnavailable(not_gpuwatchd(base_url, "status", problem))
    alerts = _alert_list(alerts_doc)
    for i, a in enumerate(alerts):
        problem = check_shape(a, ALERT_SHAPE, f"alerts[{i}]")
        if problem is not None:
            raise StatusUnavailable(not_gpuwatchd(base_url, "alert list", problem))
    return status, alerts


async def _get_json(session: aiohttp.ClientSession, url: str, base_url: str, what: str) -> Any:
    async with session.get(url) as resp:
        if resp.status != 200:
            hint = f" ({AUTH_HINT})" if resp.status == 401 else ""
            refused = DaemonRefused if resp.status in (401, 403) else StatusUnavailable
            raise refused(f"{url}: HTTP {resp.status}{hint}")
        try:
            return await read_answer(resp.content, max_bytes=MAX_ANSWER_BYTES)  # whatever answers at --url
        except AnswerError as e:
            raise StatusUnavailable(not_gpuwatchd(base_url, what, str(e))) from None


def _alert_list(doc: Any) -> list[dict[str, Any]]:
    # Accept both a bare list and Alertmanager's {"status": "success", "data": [...]} / {"alerts": [...]} shapes.
    if isinstance(doc, dict):
        doc = doc.get("data", doc.get("alerts", []))
        if isinstance(doc, dict):
            doc = doc.get("alerts", [])
    return [a for a in doc if isinstance(a, dict)] if isinstance(doc, list) else []
