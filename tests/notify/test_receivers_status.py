"""``Dispatcher.receivers_status()`` (the status page's and ``status --watch``'s delivery view), over real HTTP:
a delivered notification and a refused one per receiver, the service's error text, never the URL."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from gpuwatchd.runtime.clock import ScaledClock

from .conftest import Request, make_dispatcher, mk_alert, notify_config, receiver, start_sink


async def test_recent_deliveries_and_failures_per_receiver(tmp_path: Path) -> None:
    good, good_runner = await start_sink()
    bad, bad_runner = await start_sink("/hook/T000SECRET/B111SECRET/badSECRETtoken")

    def refuse(req: Request) -> web.Response:
        return web.Response(status=404, text="no_service")

    bad.responder = refuse
    clock = ScaledClock(speed=50.0)
    config = notify_config([receiver("chat", "slack", good.url), receiver("hook", "webhook", bad.url)],
                           group_wait="0s", routes=[{"receiver": "chat", "continue": True}, {"receiver": "hook"}])
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now())])
        d.wake()
        await good.wait_for(1)
        await bad.wait_for(1)

        def finished() -> bool:
            st = {r["name"]: r for r in d.receivers_status()}
            return bool(st["chat"]["recent"]) and bool(st["hook"]["recent"])

        for _ in range(200):
            if finished():
                break
            await asyncio.sleep(0.05)
        st = {r["name"]: r for r in d.receivers_status()}
        assert [r["name"] for r in d.receivers_status()] == ["chat", "hook"]  # config order
        chat, hook = st["chat"], st["hook"]
        assert chat["type"] == "slack" and chat["last_error"] is None and chat["queued"] == 0
        assert chat["recent"][0]["status"] == "delivered" and chat["recent"][0]["firing"] == 1
        assert hook["recent"][0]["status"] == "failed"
        assert "HTTP 404" in hook["recent"][0]["error"] and "no_service" in hook["recent"][0]["error"]
        assert "SECRET" not in repr(d.receivers_status())
    finally:
        await d.stop()
        await good_runner.cleanup()
        await bad_runner.cleanup()
