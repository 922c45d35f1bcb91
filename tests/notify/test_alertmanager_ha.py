"""An ``alertmanager`` receiver with ``urls`` (an HA cluster): every push goes to each member through its own outbox
rows and retry state, so a member that hangs or refuses delays nothing for the others; one ``url`` keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwatchd.config.types import ValidationError, validate
from gpuwatchd.notify.config import NotifyConfig, ReceiverConfig
from gpuwatchd.notify.delivery import receiver_secrets
from gpuwatchd.runtime.clock import RealClock

from .conftest import Request, Sink, make_dispatcher, mk_alert, notify_config, receiver, start_sink


@pytest.fixture
async def sinks() -> AsyncIterator[list[Sink]]:
    started = [await start_sink("/am") for _ in range(3)]
    yield [s for s, _ in started]
    for _, runner in started:
        await runner.cleanup()


def am_receiver(urls: list[str], name: str = "fleet-am", **kw: Any) -> dict[str, Any]:
    r = receiver(name, "alertmanager", "", **kw)
    del r["url"]
    return {**r, "urls": urls}


def test_urls_make_one_member_per_url_and_url_keeps_working() -> None:
    rc = validate(ReceiverConfig, am_receiver(["http://127.0.0.1:9093", "http://127.0.0.1:9094"]))
    assert [m.key for m in rc.members] == ["fleet-am", "fleet-am#1"]
    assert [m.url.get_secret_value() for m in rc.members] == ["http://127.0.0.1:9093", "http://127.0.0.1:9094"]
    assert [m.endpoint for m in rc.members] == ["alertmanager:fleet-am#0", "alertmanager:fleet-am#1"]
    assert rc.url.get_secret_value() == "http://127.0.0.1:9093"  # readers of url see the first member
    assert set(receiver_secrets(rc)) == {"http://127.0.0.1:9093", "http://127.0.0.1:9094"}
    single = validate(ReceiverConfig, receiver("one", "alertmanager", "http://127.0.0.1:9093"))
    assert [(m.key, m.endpoint) for m in single.members] == [("one", "alertmanager:one")]
    assert single.urls == ()
    # members keep the same keys when a second URL is added: the first one's queue stays its own
    assert rc.members[0].key == single.members[0].key.replace("one", "fleet-am")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"url": "http://127.0.0.1:1", "urls": ["http://127.0.0.1:2"]}, "either url or urls, not both"),
        ({"urls": []}, "non-empty list"),
        ({}, "url (or, for an alertmanager cluster, urls) is required"),
        ({"urls": ["http://127.0.0.1:1", "ftp://secret-host/x"]}, "entry 1: not an http(s) URL"),
        ({"urls": ["http://127.0.0.1:1", "http://127.0.0.1:1"]}, "entry 1 repeats a URL"),
        ({"type": "slack", "urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"]}, "a slack receiver posts to one url"),
    ],
)
def test_bad_urls_are_refused_with_a_clear_message(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as e:
        validate(ReceiverConfig, {"name": "am", "type": "alertmanager", **data})
    assert message in str(e.value)
    assert "secret-host" not in str(e.value)  # a URL is a secret: never echoed


def test_one_url_list_is_fine_for_any_receiver() -> None:
    rc = validate(ReceiverConfig, {"name": "chat", "type": "slack", "urls": ["http://127.0.0.1:1/hook"]})
    assert [m.key for m in rc.members] == ["chat"]


async def test_every_push_reaches_each_member_and_a_hung_member_delays_nothing(
    sinks: list[Sink], tmp_path: Path
) -> None:
    up, hung, refusing = sinks
    release = asyncio.Event()

    async def hang(_: Request) -> web.StreamResponse:
        await release.wait()  # holds the request open until the test ends
        return web.Response(text="late")

    hung.responder = hang
    refusing.responder = lambda _: web.Response(status=503, text="cluster member shutting down")
    config: NotifyConfig = notify_config(
        [am_receiver([up.url, hung.url, refusing.url], timeout="60s")], alertmanager_resend="1h"
    )
    clock = RealClock()
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        a = mk_alert("GpuLost", severity="critical", t=clock.now() - 5)
        d.update([a])
        [push] = await up.wait_for(1)
        # The healthy member got the push while the hung member's request is still open, and the refusing member
        # is being retried on its own schedule: neither held the healthy one back.
        await hung.wait_for(1)
        assert not release.is_set()
        await refusing.wait_for(3)  # retried (0.2 s backoff), while the hung request still hangs
        assert len(hung.requests) == 1 and not release.is_set()
        [alert] = push.json
        assert alert["labels"] == a.labels
        assert hung.requests[0].json == push.json == refusing.requests[0].json  # the same push to every member
        # Per-member outbox state: delivered for the healthy one, in flight / retrying for the others.
        assert [r.status for r in d.outbox.rows("fleet-am")] == ["delivered"]
        assert [r.status for r in d.outbox.rows("fleet-am#1")] == ["pending"]
        [retrying] = d.outbox.rows("fleet-am#2")
        assert retrying.status == "pending" and retrying.attempts >= 2
        errors = d.last_errors()
        assert errors["fleet-am"] is None
        assert "HTTP 503" in (errors["fleet-am#2"] or "") and "alertmanager:fleet-am#2" in (errors["fleet-am#2"] or "")
        assert set(d._depths) >= {"fleet-am#1", "fleet-am#2"}  # the outbox depth gauge is per member
        # /api/v1/status and the page list each member with its own health and last error, not only the first.
        [st] = d.receivers_status()
        members = st["members"]
        assert [(m["name"], m["index"], m["health"]) for m in members] == [
            ("fleet-am", 0, "up"), ("fleet-am#1", 1, "unknown"), ("fleet-am#2", 2, "failing")]
        assert members[0]["last_error"] is None and members[0]["last_delivered"] is not None
        assert "HTTP 503" in members[2]["last_error"] and "cluster member shutting down" in members[2]["last_error"]
        assert members[2]["queued"] == 1 and members[2]["last_delivered"] is None
        assert up.url not in repr(st) and refusing.url not in repr(st)  # members are named, never described

        # The refusing member recovers: it gets the push it missed, and its row is delivered.
        refusing.responder = None
        before = len(refusing.requests)
        await refusing.wait_for(before + 1, timeout=30)
        for _ in range(100):
            if [r.status for r in d.outbox.rows("fleet-am#2")] == ["delivered"]:
                break
            await asyncio.sleep(0.05)
        assert [r.status for r in d.outbox.rows("fleet-am#2")] == ["delivered"]
        assert len(up.requests) == 1  # the healthy member was not re-sent anything meanwhile
        recovered = d.receivers_status()[0]["members"][2]
        assert (recovered["health"], recovered["last_error"], recovered["queued"]) == ("up", None, 0)
    finally:
        release.set()
        await d.stop()


async def test_single_url_receiver_is_unchanged(sinks: list[Sink], tmp_path: Path) -> None:
    up = sinks[0]
    config = notify_config([receiver("am", "alertmanager", up.url)], alertmanager_resend="1h")
    clock = RealClock()
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        d.update([mk_alert("GpuLost", severity="critical", t=clock.now() - 5)])
        await up.wait_for(1)
        assert {r.receiver for r in d.outbox.rows()} == {"am"}
    finally:
        await d.stop()


async def test_adding_a_member_keeps_the_first_members_state_and_removing_one_fails_its_rows(
    sinks: list[Sink], tmp_path: Path
) -> None:
    first, second, _ = sinks
    clock = RealClock()
    d = await make_dispatcher(
        notify_config([receiver("am", "alertmanager", first.url)], alertmanager_resend="1h"), tmp_path / "s", clock
    )
    try:
        d.update([mk_alert("GpuLost", severity="critical", t=clock.now() - 5)])
        await first.wait_for(1)
        second.responder = lambda _: web.Response(status=503)
        d.reconfigure(notify_config([am_receiver([first.url, second.url], "am")], alertmanager_resend="1h"))
        await second.wait_for(1)
        assert next(r.status for r in d.outbox.rows("am")) == "delivered"  # member 0's history is its own still
        d.reconfigure(notify_config([receiver("am", "alertmanager", first.url)], alertmanager_resend="1h"))
        for _ in range(200):
            if all(r.status != "pending" for r in d.outbox.rows("am#1")):
                break
            await asyncio.sleep(0.05)
        assert {r.status for r in d.outbox.rows("am#1")} == {"failed"}
        assert "am#1" not in d.last_errors()
    finally:
        await d.stop()


async def test_a_members_queue_survives_a_restart(sinks: list[Sink], tmp_path: Path) -> None:
    """The down member's pending push is in the state database under its own key: after a restart it is sent to
    that member (and only to it), while the member that was up is not sent it again."""
    up, down, _ = sinks
    down.responder = lambda _: web.Response(status=503)
    config = notify_config([am_receiver([up.url, down.url], "am")], alertmanager_resend="1h")
    clock = RealClock()
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        d.update([mk_alert("GpuLost", severity="critical", t=clock.now() - 5)])
        await up.wait_for(1)
        await down.wait_for(1)
    finally:
        await d.stop()
    assert [r.status for r in d.outbox.rows("am#1")] == ["pending"]
    down.responder = None
    before_up, before_down = len(up.requests), len(down.requests)
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        await down.wait_for(before_down + 1)
        for _ in range(100):
            if [r.status for r in d.outbox.rows("am#1")] == ["delivered"]:
                break
            await asyncio.sleep(0.05)
        assert [r.status for r in d.outbox.rows("am#1")] == ["delivered"]
        assert len(up.requests) == before_up
    finally:
        await d.stop()
