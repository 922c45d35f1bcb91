"""``POST /api/v1/probe``: run probes now through the daemon (its one-at-a-time lock and its baselines).

Body ``{"gpus": ["0", "GPU-..."], "probes": ["gemm"]}`` (both optional: every present GPU, every enabled probe).
Guarded like the silences API (``notify.api``: loopback peers only by default, bearer token when set): a probe
run takes GPU time, so it is a write. The answer lists, per GPU, each probe's result with measured, baseline and
expected figures; ``gpuwatchd probe`` prints it as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from gpuwatchd.model.probes import ProbeRecord
from gpuwatchd.notify.api import write_refusal
from gpuwatchd.notify.config import ApiConfig
from gpuwatchd.notify.cross_site import JSON_CONTENT_TYPE_ERROR, json_content_type
from gpuwatchd.notify.json_body import BodyError, read_json
from gpuwatchd.probes.config import PROBE_NAMES
from gpuwatchd.probes.service import ProbeService
from gpuwatchd.store import Store
from gpuwatchd.textint import ascii_uint

MAX_BODY_BYTES = 16 * 1024
BODY_TIMEOUT_SECONDS = 10.0
MAX_SELECTORS = 64  # GPUs (or probes) named in one request: more GPUs than a host has
MAX_SELECTOR_CHARS = 96  # a GPU UUID is 40 characters, a MIG one 44; an index at most 4 digits
BODY_KEYS = ("gpus", "probes")


class SelectError(ValueError):
    pass


def select_gpus(store: Store, wanted: list[str]) -> list[tuple[str, int, str | None]]:
    """(uuid, index, name) of the GPUs named by index or UUID (all present GPUs when none are named)."""
    # GPUs, not their MIG devices (which share their GPU's index)
    gpus = [g for g in store.latest.gpus if g.parent_uuid is None] if store.latest is not None else []
    if not wanted:
        return [(g.uuid, g.index, g.name) for g in gpus]
    out = []
    for w in wanted:
        index = ascii_uint(w, 4)  # never int() on the text: Unicode digits, 4301-digit strings
        match = [g for g in gpus if w == g.uuid or (index is not None and index == g.index)]
        if not match:
            known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
            raise SelectError(f"no present GPU {w[:MAX_SELECTOR_CHARS]!r} (present: {known})")
        g = match[0]
        if (g.uuid, g.index, g.name) not in out:
            out.append((g.uuid, g.index, g.name))
    return out


def select_probes(wanted: list[str], enabled: list[str]) -> list[str]:
    for p in wanted:
        if p not in PROBE_NAMES:
            raise SelectError(f"unknown probe {p[:MAX_SELECTOR_CHARS]!r} (known: {', '.join(PROBE_NAMES)})")
    return list(wanted) or enabled


def parse_request(body: object) -> tuple[list[str], list[str]]:
    """(gpus, probes) of a request body; SelectError naming the field for anything else.

    Like the silences API (``notify/silence_input.py``): an object with known keys only, each a list of bounded
    strings, or absent / null for "all".
    """
    if not isinstance(body, dict):
        raise SelectError(f"expected a JSON object with {' and/or '.join(BODY_KEYS)}, got {type(body).__name__}")
    unknown = [k for k in body if k not in BODY_KEYS]
    if unknown:
        raise SelectError(f"unknown key {unknown[0][:MAX_SELECTOR_CHARS]!r} (known: {', '.join(BODY_KEYS)})")
    out: list[list[str]] = []
    for key in BODY_KEYS:
        value = body.get(key)
        if value is None:
            out.append([])
            continue
        if not isinstance(value, list):
            raise SelectError(f"{key}: expected a list of strings, got {type(value).__name__}")
        if len(value) > MAX_SELECTORS:
            raise SelectError(f"{key}: at most {MAX_SELECTORS} entries")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise SelectError(f"{key}[{i}]: expected a string, got {type(item).__name__}")
            if not 0 < len(item) <= MAX_SELECTOR_CHARS:
                raise SelectError(f"{key}[{i}]: expected 1..{MAX_SELECTOR_CHARS} characters")
        out.append(value)
    return out[0], out[1]


def record_json(service: ProbeService, rec: ProbeRecord) -> dict[str, Any]:
    link = service.link_expectation(rec.uuid)
    return {
        "probe": rec.probe,
        "result": rec.result,
        "problem": rec.problem,
        "errors": rec.errors,
        "seconds": rec.duration_seconds,
        "measures": {
            k: {
                "measured": v,
                "baseline": service.baselines.baseline(rec.uuid, k),
                "expected": link.bytes_per_second if link is not None and k.startswith("pcie.") else None,
                "expected_name": link.name if link is not None and k.startswith("pcie.") else None,
                "degraded": rec.degraded.get(k),
            }
            for k, v in sorted(rec.measures.items())
        },
    }


async def run_request(service: ProbeService, gpus: list[str], probes: list[str]) -> dict[str, Any]:
    """Run the probes of the selected GPUs one after the other; the answer of the API and of a direct run."""
    targets = select_gpus(service.store, gpus)
    chosen = select_probes(probes, service.cfg.selected())
    if not await service.ensure_available():
        reason = service.ledger.unavailable_reason
        return {"available": False, "reason": reason, "gpus": []}
    out = []
    for uuid, index, name in targets:
        records = await service.run_gpu(uuid, chosen)
        skipped = not records
        out.append({"uuid": uuid, "index": index, "name": name,
                    "skipped": service.last_skip(uuid) if skipped else None,
                    "records": [record_json(service, r) for r in records]})
    return {"available": True, "device": service.device, "gpus": out}


def probe_routes(service: ProbeService, api: Callable[[], ApiConfig]) -> list[web.RouteDef]:
    async def post(request: web.Request) -> web.Response:
        refused = write_refusal(request, api(), "probes")
        if refused is not None:
            return refused
        has_body = request.can_read_body
        try:
            body = (await read_json(request, max_bytes=MAX_BODY_BYTES, timeout=BODY_TIMEOUT_SECONDS)
                    if has_body else {})
        except BodyError as e:
            return web.json_response({"error": str(e)}, status=e.status)
        if has_body and not json_content_type(request):
            return web.json_response({"error": JSON_CONTENT_TYPE_ERROR}, status=415)
        try:
            gpus, probes = parse_request(body)
            return web.json_response(await run_request(service, gpus, probes))
        except SelectError as e:
            return web.json_response({"error": str(e)}, status=400)

    return [web.post("/api/v1/probe", post)]
