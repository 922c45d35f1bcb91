"""Retry classification, Retry-After, permanent failures, timeouts, rate limits and a long outage, over real HTTP.

Time is compressed with a ScaledClock: every wait asserted here is in clock seconds and is a lower bound set by
the scheduling logic (what the server asked for), not a performance claim.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import ScaledClock

from .conftest import UUID0, Request, Sink, make_dispatcher, mk_alert, notify_config, receiver, settle

SPEED = 50.0


def metric(d: Dispatcher, name: str, **labels: str) -> float:
    reg = CollectorRegistry()
    reg.register(d.collector())
    value = reg.get_sample_value(name, labels)
    return 0.0 if value is None else value


def scripted(sink: Sink, clock: ScaledClock, responses: list[web.Response]) -> list[float]:
    """Answer with ``responses`` in turn (then 200 ok); returns the clock time of each request."""
    times: list[float] = []

    def respond(req: Request) -> web.Response:
        times.append(clock.now())
        return responses.pop(0) if responses else web.Response(text="ok")

    sink.responder = respond
    return times


async def one_alert(
    sink: Sink, tmp_path: Path, clock: ScaledClock, type_: str = "webhook", **rkw: object
) -> Dispatcher:
    config = notify_config([receiver("r1", type_, sink.url, **rkw)], group_wait="0s")
    d = await make_dispatcher(config, tmp_path, clock)
    d.update([mk_alert(t=clock.now())])
    return d


async def test_5xx_retried_with_backoff_then_delivered(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=SPEED)
    times = scripted(sink, clock, [web.Response(status=500), web.Response(status=503)])
    d = await one_alert(sink, tmp_path, clock)
    try:
        reqs = await settle(d, sink, 3)
        assert len({r.headers["Idempotency-Key"] for r in reqs}) == 1  # same notification each time
        # Backoff after attempt n is >= initial * 1.5**(n-1) * 0.5 (jitter) clock seconds.
        assert times[1] - times[0] >= 0.2 * 0.5
        assert times[2] - times[1] >= 0.3 * 0.5
        assert metric(d, "gpuwatchd_notifications_total", receiver="r1", integration="webhook", outcome="retry") == 2
        assert metric(d, "gpuwatchd_notifications_total", receiver="r1", integration="webhook", outcome="success") == 1
        assert [r.status for r in d.outbox.rows()] == ["delivered"]
        assert metric(d, "gpuwatchd_notification_outbox_depth", receiver="r1") == 0
    finally:
        await d.stop()


async def test_teams_202_accepted_is_success(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=SPEED)
    scripted(sink, clock, [web.Response(status=202)])
    d = await one_alert(sink, tmp_path, clock, "teams")
    try:
        [req] = await settle(d, sink, 1)
        assert req.json["attachments"][0]["content"]["type"] == "AdaptiveCard"
        assert [r.status for r in d.outbox.rows()] == ["delivered"]
    finally:
        await d.stop()


async def test_429_honours_retry_after_seconds(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=SPEED)
    times = scripted(sink, clock, [web.Response(status=429, headers={"Retry-After": "7"})])
    d = await one_alert(sink, tmp_path, clock, "slack")
    try:
        await settle(d, sink, 2)
        assert times[1] - times[0] >= 7.0
        assert (
            metric(d, "gpuwatchd_notification_failures_total", receiver="r1", integration="slack", reason="http_429")
            == 1
        )
    finally:
        await d.stop()


async def test_discord_429_body_retry_after(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=SPEED)
    body = '{"message": "You are being rate limited.", "retry_after": 4.5, "global": false}'
    times = scripted(sink, clock, [web.Response(status=429, text=body, content_type="application/json")])
    d = await one_alert(sink, tmp_path, clock, "discord")
    try:
        await settle(d, sink, 2)
        assert times[1] - times[0] >= 4.5
    finally:
        await d.stop()


async def test_4xx_is_permanent(sink: Sink, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ScaledClock(speed=SPEED)
    scripted(sink, clock, [web.Response(status=400, text="invalid_payload")])
    d = await one_alert(sink, tmp_path, clock, "slack")
    try:
        await settle(d, sink, 1)
        await asyncio.sleep(0.3)  # 15 clock seconds: a retry would have happened by now
        assert len(sink.requests) == 1
        [row] = d.outbox.rows()
        assert row.status == "failed"
        assert row.last_error == "slack:r1: HTTP 400: invalid_payload"
        assert metric(d, "gpuwatchd_notifications_total", receiver="r1", integration="slack", outcome="failure") == 1
        assert any("slack:r1" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)
    finally:
        await d.stop()


async def test_timeout_is_retried(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=SPEED)
    calls = 0

    async def slow_once(req: Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(1)
        return web.Response(text="ok")

    sink.responder = slow_once
    d = await one_alert(sink, tmp_path, clock, "mattermost", timeout="0.3s")
    try:
        await settle(d, sink, 2)
        assert d.outbox.rows()[0].status == "delivered"
        assert (
            metric(
                d, "gpuwatchd_notification_failures_total", receiver="r1", integration="mattermost", reason="timeout"
            )
            == 1
        )
    finally:
        await d.stop()


async def test_connection_refused_is_retried_and_redacted(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}/services/SECRETPATHxyz"
    clock = ScaledClock(speed=SPEED)
    config = notify_config([receiver("r1", "slack", url)], group_wait="0s")
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now())])
        for _ in range(100):
            await asyncio.sleep(0.02)
            if d.outbox.rows() and d.outbox.rows()[0].attempts >= 2:
                break
        [row] = d.outbox.rows()
        assert row.status == "pending" and row.attempts >= 2
        assert row.last_error is not None and row.last_error.startswith("slack:r1: ")
        assert "SECRETPATH" not in row.last_error
    finally:
        await d.stop()


async def test_rate_limit_spaces_requests(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=5.0)  # slow enough that loopback latency is small in clock seconds
    times = scripted(sink, clock, [])
    config = notify_config(
        [receiver("r1", "webhook", sink.url, rate_limit_per_minute=60)], group_wait="0s", group_by=["uuid"]
    )
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        start = clock.now()
        d.update([mk_alert(uuid=f"GPU-{i}", t=start) for i in range(8)])
        await settle(d, sink, 8)
        # Burst of 5, then one per second (60/min): the n-th request past the burst cannot leave before n tokens have
        # been refilled since the first one was taken (lower bounds only: arrival times add loopback latency, which
        # a loaded machine stretches in clock seconds, so gaps between two arrivals prove nothing).
        for i in (5, 6, 7):
            assert times[i] - start >= (i - 4) * 0.99, (i, [t - start for t in times])
    finally:
        await d.stop()


async def test_long_outage_then_everything_once_in_order(sink: Sink, tmp_path: Path) -> None:
    clock = ScaledClock(speed=1200.0)  # 20 clock minutes per real second
    outage_until = clock.now() + 1800  # 30 minutes down
    ok: list[Request] = []

    def respond(req: Request) -> web.Response:
        if clock.now() < outage_until:
            return web.Response(status=503, text="down")
        ok.append(req)
        return web.Response(text="ok")

    sink.responder = respond
    config = notify_config(
        [receiver("r1", "webhook", sink.url)],
        group_wait="0s",
        group_by=["uuid"],
        retry_initial="1s",
        retry_max="60s",
    )
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        alerts = []
        for i in range(20):  # one new GPU alert per ~minute during the outage
            alerts.append(mk_alert(uuid=f"GPU-{i:02d}", gpu=str(i), t=clock.now()))
            d.update(alerts)
            await asyncio.sleep(0.05)
        while clock.now() < outage_until + 120 or len(ok) < 20:
            d.update(alerts)
            await asyncio.sleep(0.05)
            assert clock.now() < outage_until + 3600, "not all delivered within an hour after recovery"
        await asyncio.sleep(0.1)
        keys = [r.headers["Idempotency-Key"] for r in ok]
        assert len(keys) == len(set(keys)) == 20  # each exactly once
        assert [r.json["alerts"][0]["labels"]["uuid"] for r in ok] == [f"GPU-{i:02d}" for i in range(20)]
        assert len(sink.requests) > 20  # the outage really refused attempts
        assert all(r.status == "delivered" for r in d.outbox.rows())
    finally:
        await d.stop()


async def test_expired_notifications_are_dropped(sink: Sink, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    clock = ScaledClock(speed=SPEED)
    sink.responder = lambda req: web.Response(status=500)
    config = notify_config([receiver("r1", "webhook", sink.url)], group_wait="0s", max_retry_age="3s")
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update([mk_alert(uuid=UUID0, t=clock.now())])
        for _ in range(100):
            await asyncio.sleep(0.02)
            if d.outbox.rows()[0].status == "failed":
                break
        assert d.outbox.rows()[0].status == "failed"
        assert (
            metric(d, "gpuwatchd_notification_failures_total", receiver="r1", integration="webhook", reason="expired")
            == 1
        )
    finally:
        await d.stop()


def test_metrics_exposition_has_the_families(tmp_path: Path) -> None:
    d = Dispatcher(notify_config([]), state_dir=tmp_path, clock=ScaledClock(), host="h")
    reg = CollectorRegistry()
    reg.register(d.collector())
    text = generate_latest(reg).decode()
    for family in (
        "gpuwatchd_notification_outbox_depth",
        "gpuwatchd_silences",
        "gpuwatchd_alerts_inhibited",
        "gpuwatchd_alerts_silenced",
        "gpuwatchd_notify_receivers",
    ):
        assert f"# TYPE {family} gauge" in text
    # No receiver: exported as 0, so "alerts go nowhere" can itself be alerted on (docs/notifications.md).
    assert "\ngpuwatchd_notify_receivers 0.0\n" in text
    d.state.close()
