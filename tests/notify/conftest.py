"""Shared helpers for the notify tests: a real local HTTP sink playing a chat service, alert and config builders."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwatchd.config.types import validate
from gpuwatchd.model import Alert
from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import Clock, ManualClock

HOST = "gpu-host-1"
UUID0 = "GPU-0a1b2c3d-1111-2222-3333-444455556666"
UUID1 = "GPU-9f8e7d6c-1111-2222-3333-444455556666"


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Responder = Callable[[Request], Awaitable[web.StreamResponse] | web.StreamResponse]


@dataclass
class Sink:
    """A real HTTP server on loopback that records every POST and answers with ``responder``."""

    url: str = ""
    requests: list[Request] = field(default_factory=list)
    responder: Responder | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        req = Request(request.path_qs, dict(request.headers), await request.read())
        self.requests.append(req)
        self.arrived.set()
        if self.responder is None:
            return web.Response(text="ok")
        res = self.responder(req)
        if isinstance(res, web.StreamResponse):
            return res
        return await res

    async def wait_for(self, n: int, timeout: float = 20.0) -> list[Request]:
        """Wait until ``n`` requests arrived (a liveness bound, not a timing assertion)."""

        async def until() -> None:
            while len(self.requests) < n:
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(until(), timeout)
        return self.requests

    def bodies(self) -> list[Any]:
        return [r.json for r in self.requests]


async def start_sink(path: str = "/hook/T000SECRET/B000SECRET/xyzSECRETtoken") -> tuple[Sink, web.AppRunner]:
    sink = Sink()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", sink.handle)
    # No access log: it would print the secret path into the captured logs the leak test scans.
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sink.url = f"http://127.0.0.1:{port}{path}"
    return sink, runner


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    s, runner = await start_sink()
    yield s
    await runner.cleanup()


def mk_alert(
    name: str = "GpuThrottled",
    *,
    severity: str = "warning",
    uuid: str = UUID0,
    gpu: str = "0",
    state: str = "firing",
    t: float = 1_700_000_000.0,
    resolved_at: float | None = None,
    summary: str = "",
    extra: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    value: float | None = None,
) -> Alert:
    labels = {
        "alertname": name,
        "severity": severity,
        "uuid": uuid,
        "gpu": gpu,
        "model": "NVIDIA A100-SXM4-80GB",
        "host": HOST,
    }
    labels.update(extra or {})
    return Alert(
        name=name,
        severity=severity,  # type: ignore[arg-type]
        labels=labels,
        summary=summary or f"{name} on GPU {gpu}",
        description=f"{name} description",
        state=state,  # type: ignore[arg-type]
        active_at=t,
        fired_at=t,
        resolved_at=resolved_at if state == "resolved" else None,
        value=value,
        annotations=annotations or {},
    )


def resolved(a: Alert, at: float) -> Alert:
    from dataclasses import replace

    return replace(a, state="resolved", resolved_at=at)


def notify_config(receivers: list[dict[str, Any]], **kw: Any) -> NotifyConfig:
    data: dict[str, Any] = {"receivers": receivers, "retry_initial": "0.2s", "retry_max": "2s"}
    data.update(kw)
    return validate(NotifyConfig, data)


def receiver(name: str, type_: str, url: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "url": url, "rate_limit_per_minute": 6000, "timeout": "5s", **kw}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def make_dispatcher(config: NotifyConfig, state_dir: Path, clock: Clock, *, start: bool = True) -> Dispatcher:
    d = Dispatcher(config, state_dir=state_dir, clock=clock, host=HOST)
    if start:
        await d.start()
    return d


async def settle(d: Dispatcher, sink: Sink, n: int) -> list[Request]:
    """Let the workers deliver until the sink holds ``n`` requests, then one more loop turn."""
    d.wake()
    reqs = await sink.wait_for(n)
    await asyncio.sleep(0.05)
    return reqs
