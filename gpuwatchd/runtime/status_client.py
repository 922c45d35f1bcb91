"""Fetch a running daemon's status and alerts over HTTP (``gpuwatchd status``, ``status --watch`` and ``doctor``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from gpuwatchd.runtime.daemon_client import AUTH_HINT, ClientSetupError, DaemonClient, tls_problem
from gpuwatchd.runtime.http_body import read_capped

# The largest status a daemon sends: 256 GPUs with thousands of processes each is a few MiB.
MAX_ANSWER_BYTES = 64 << 20


class StatusUnavailable(Exception):
    """No daemon answered at the URL (or it answered something that is not gpuwatchd's status API)."""


class DaemonRefused(StatusUnavailable):
    """A daemon answers at the URL but refused us: HTTP 401/403, or the TLS handshake failed."""


async def fetch_status(base_url: str, *, timeout: float = 5.0,
                       client: DaemonClient | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """GET ``/api/v1/status`` and ``/api/v1/alerts``; raises :class:`StatusUnavailable` with a readable reason.
    ``client``: TLS trust and basic auth for a daemon with a web config (runtime/daemon_client.py)."""
    t = aiohttp.ClientTimeout(total=timeout)
    try:
        args = (client or DaemonClient()).session_args()
    except ClientSetupError as e:
        raise StatusUnavailable(str(e)) from None
    try:
        async with aiohttp.ClientSession(timeout=t, **args) as session:
            status = await _get_json(session, f"{base_url}/api/v1/status")
            alerts_doc = await _get_json(session, f"{base_url}/api/v1/alerts")
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        problem = tls_problem(base_url, e)
        if problem is not None:
            raise DaemonRefused(f"no gpuwatchd reachable at {base_url}: {problem}") from None
        reason = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e) or type(e).__name__
        raise StatusUnavailable(f"no gpuwatchd reachable at {base_url}: {reason}") from None
    if not isinstance(status, dict):
        raise StatusUnavailable(f"{base_url}/api/v1/status did not return a JSON object")
    return status, _alert_list(alerts_doc)


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        if resp.status != 200:
            hint = f" ({AUTH_HINT})" if resp.status == 401 else ""
            refused = DaemonRefused if resp.status in (401, 403) else StatusUnavailable
            raise refused(f"{url}: HTTP {resp.status}{hint}")
        raw = await read_capped(resp.content, MAX_ANSWER_BYTES + 1)  # whatever answers at --url
        if len(raw) > MAX_ANSWER_BYTES:
            raise StatusUnavailable(f"{url}: the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB (is this a "
                                    "gpuwatchd?)")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise StatusUnavailable(f"{url}: not JSON (is this a gpuwatchd?)") from None



def _alert_list(doc: Any) -> list[dict[str, Any]]:
    # Accept both a bare list and Alertmanager's {"status": "success", "data": [...]} / {"alerts": [...]} shapes.
    if isinstance(doc, dict):
        doc = doc.get("data", doc.get("alerts", []))
        if isinstance(doc, dict):
            doc = doc.get("alerts", [])
    return [a for a in doc if isinstance(a, dict)] if isinstance(doc, list) else []
