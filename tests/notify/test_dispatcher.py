"""Grouping and timing with a ManualClock, delivered to a real local webhook sink."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.notify.dispatcher import Dispatcher
from gpuwatchd.runtime.clock import ManualClock

from .conftest import UUID0, UUID1, Sink, make_dispatcher, mk_alert, notify_config, receiver, resolved, settle


def cfg(sink: Sink, **kw: object) -> NotifyConfig:
    opts: dict[str, object] = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h", "routes": []}
    opts.update(kw)
    return notify_config([receiver("hook", "webhook", sink.url)], **opts)


async def idle(d: Dispatcher) -> None:
    """Give workers a chance to send anything queued (used before asserting that nothing arrived)."""
    d.wake()
    await asyncio.sleep(0.1)


async def test_group_wait_then_first_notification(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink), tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        d.update([a])
        clock.advance(29)
        d.flush_due()
        await idle(d)
        assert sink.requests == []  # still inside group_wait
        clock.advance(1)
        d.flush_due()
        [req] = await settle(d, sink, 1)
        body = req.json
        assert body["status"] == "firing"
        assert body["notification_reason"] == "first notification"
        assert [x["fingerprint"] for x in body["alerts"]] == [a.fingerprint]
        assert body["groupLabels"] == {"alertname": "GpuThrottled", "host": "gpu-host-1", "uuid": UUID0}
    finally:
        await d.stop()


async def test_sibling_joins_within_group_wait_and_dedup(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    config = cfg(sink, group_by=["alertname", "host"])
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        b = mk_alert(t=clock.now(), uuid=UUID1, gpu="1")
        d.update([a])
        clock.advance(10)
        d.update([a, b])
        clock.advance(20)
        d.flush_due()
        await settle(d, sink, 1)
        assert len(sink.requests[0].json["alerts"]) == 2
        # Unchanged alerts on every evaluation and every group_interval: nothing new is sent (dedup).
        for _ in range(5):
            clock.advance(300)
            d.update([a, b])
        await idle(d)
        assert len(sink.requests) == 1
    finally:
        await d.stop()


async def test_group_interval_new_alert_and_resolved(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink, group_by=["alertname", "host"]), tmp_path, clock)
    try:
        t0 = clock.now()
        a = mk_alert(t=t0)
        d.update([a])
        clock.advance(30)
        d.flush_due()
        await settle(d, sink, 1)
        b = mk_alert(t=clock.now(), uuid=UUID1, gpu="1")
        clock.advance(60)
        d.update([a, b])  # joins the flushed group: waits for the next group_interval tick
        await idle(d)
        assert len(sink.requests) == 1
        clock.advance(240)  # t0 + 330 = first flush + group_interval
        d.flush_due()
        await settle(d, sink, 2)
        second = sink.requests[1].json
        assert second["notification_reason"] == "new alerts added"
        assert len(second["alerts"]) == 2
        # b resolves: sent at the next tick as "some alerts resolved", status still firing (a fires).
        clock.advance(10)
        d.update([a, resolved(b, clock.now())])
        clock.advance(290)
        d.flush_due()
        await settle(d, sink, 3)
        third = sink.requests[2].json
        assert third["status"] == "firing"
        assert third["notification_reason"] == "some alerts resolved"
        assert sorted(x["status"] for x in third["alerts"]) == ["firing", "resolved"]
        # a resolves: "all alerts resolved"; then silence (the rules keep reporting resolved alerts for a while).
        d.update([resolved(a, clock.now()), resolved(b, clock.now() - 300)])
        clock.advance(300)
        d.flush_due()
        await settle(d, sink, 4)
        last = sink.requests[3].json
        assert last["status"] == "resolved"
        assert [x["status"] for x in last["alerts"]] == ["resolved"]
        for _ in range(3):
            clock.advance(300)
            d.update([resolved(a, t0 + 630), resolved(b, t0 + 340)])
        await idle(d)
        assert len(sink.requests) == 4
    finally:
        await d.stop()


async def test_repeat_interval(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink, repeat_interval="1h"), tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        d.update([a])
        clock.advance(30)
        d.flush_due()
        await settle(d, sink, 1)
        for _ in range(11):  # 55 min of group_interval ticks: below repeat_interval
            clock.advance(300)
            d.update([a])
        await idle(d)
        assert len(sink.requests) == 1
        clock.advance(300)  # 60 min since the first send: repeat
        d.update([a])
        await settle(d, sink, 2)
        assert sink.requests[1].json["notification_reason"] == "repeat interval elapsed"
    finally:
        await d.stop()


async def test_flap_within_group_wait_sends_nothing(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink), tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        d.update([a])
        clock.advance(10)
        d.update([resolved(a, clock.now())])
        clock.advance(20)
        d.flush_due()
        clock.advance(600)
        d.update([resolved(a, clock.now() - 600)])
        await idle(d)
        assert sink.requests == []
    finally:
        await d.stop()


async def test_vanished_firing_alert_is_resolved(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink, group_wait="0s"), tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now())])
        await settle(d, sink, 1)
        clock.advance(300)
        d.update([])
        await settle(d, sink, 2)
        assert sink.requests[1].json["status"] == "resolved"
    finally:
        await d.stop()


async def test_pending_alerts_are_not_notified(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink, group_wait="0s"), tmp_path, clock)
    try:
        d.update([mk_alert(t=clock.now(), state="pending")])
        clock.advance(600)
        d.update([mk_alert(t=clock.now() - 600, state="pending")])
        await idle(d)
        assert sink.requests == []
    finally:
        await d.stop()


async def test_routing_by_severity_with_continue_and_default(tmp_path: Path, clock: ManualClock) -> None:
    from .conftest import start_sink

    (crit, r1), (team, r2), (default, r3) = [await start_sink(f"/h{i}") for i in range(3)]
    config = notify_config(
        [
            receiver("pager", "webhook", crit.url),
            receiver("team", "webhook", team.url),
            receiver("catchall", "webhook", default.url),
        ],
        default_receiver="catchall",
        group_wait="0s",
        routes=[
            {"matchers": ['severity="critical"'], "receiver": "pager", "continue": True},
            {"matchers": ['severity=~"critical|warning"'], "receiver": "team"},
        ],
    )
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        d.update(
            [
                mk_alert("GpuLost", severity="critical", t=clock.now()),
                mk_alert("GpuThrottled", severity="warning", uuid=UUID1, t=clock.now()),
                mk_alert("GpuTemperatureHigh", severity="info", uuid=UUID1, t=clock.now()),
            ]
        )
        d.wake()
        await crit.wait_for(1)
        await team.wait_for(2)
        await default.wait_for(1)
        await asyncio.sleep(0.1)
        names = lambda s: sorted(r.json["commonLabels"]["alertname"] for r in s.requests)  # noqa: E731
        assert names(crit) == ["GpuLost"]
        assert names(team) == ["GpuLost", "GpuThrottled"]
        assert names(default) == ["GpuTemperatureHigh"]
        assert crit.requests[0].json["receiver"] == "pager"
    finally:
        await d.stop()
        for r in (r1, r2, r3):
            await r.cleanup()


async def test_default_route_sends_critical_without_group_wait(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    # Default config routes: critical alerts skip the 30 s group_wait.
    d = await make_dispatcher(notify_config([receiver("hook", "webhook", sink.url)]), tmp_path, clock)
    try:
        d.update(
            [
                mk_alert("GpuLost", severity="critical", t=clock.now()),
                mk_alert("GpuThrottled", uuid=UUID1, t=clock.now()),
            ]
        )
        await settle(d, sink, 1)
        assert [r.json["commonLabels"]["alertname"] for r in sink.requests] == ["GpuLost"]
        clock.advance(30)
        d.flush_due()
        await settle(d, sink, 2)
        assert sink.requests[1].json["commonLabels"]["alertname"] == "GpuThrottled"
    finally:
        await d.stop()


async def test_gpu_lost_inhibits_that_gpus_other_alerts(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    d = await make_dispatcher(cfg(sink, group_wait="0s"), tmp_path, clock)
    try:
        lost = mk_alert("GpuLost", severity="critical", t=clock.now())
        throttled0 = mk_alert("GpuThrottled", t=clock.now())
        throttled1 = mk_alert("GpuThrottled", uuid=UUID1, gpu="1", t=clock.now())
        d.update([lost, throttled0, throttled1])
        await settle(d, sink, 2)
        await idle(d)
        got = sorted((r.json["commonLabels"]["alertname"], r.json["commonLabels"]["uuid"]) for r in sink.requests)
        assert got == [("GpuLost", UUID0), ("GpuThrottled", UUID1)]
        muting = d.muting(throttled0, clock.now())
        assert muting.inhibited_by == (lost.fingerprint,)
        # Once the GPU is back, the still-firing alert of that GPU is notified.
        clock.advance(300)
        d.update([resolved(lost, clock.now()), throttled0, throttled1])
        await settle(d, sink, 4)
        got = sorted((r.json["commonLabels"]["alertname"], r.json["status"]) for r in sink.requests[2:])
        assert got == [("GpuLost", "resolved"), ("GpuThrottled", "firing")]
    finally:
        await d.stop()


async def test_inhibition_ending_does_not_resend_the_same_group(
    sink: Sink, tmp_path: Path, clock: ManualClock
) -> None:
    """Told GpuThrottled fires; GpuLost inhibits it, then resolves: the group is unchanged, nothing is re-sent
    before repeat_interval (Alertmanager stops the pipeline when every alert of a group is muted)."""
    d = await make_dispatcher(cfg(sink, group_wait="0s", group_interval="30s"), tmp_path, clock)
    try:
        throttled = mk_alert("GpuThrottled", t=clock.now())
        d.update([throttled])
        await settle(d, sink, 1)
        clock.advance(60)
        lost = mk_alert("GpuLost", severity="critical", t=clock.now())
        d.update([lost, throttled])
        await settle(d, sink, 2)
        assert d.muting(throttled, clock.now()).inhibited_by == (lost.fingerprint,)
        for _ in range(4):  # several group_intervals while inhibited
            clock.advance(31)
            d.update([lost, throttled])
        clock.advance(60)
        d.update([resolved(lost, clock.now()), throttled])
        await settle(d, sink, 3)
        for _ in range(4):  # several group_intervals after the inhibition ended, well inside repeat_interval
            clock.advance(31)
            d.update([throttled])
        await idle(d)
        sent = [(a["labels"]["alertname"], a["status"]) for r in sink.requests for a in r.json["alerts"]]
        assert sent == [("GpuThrottled", "firing"), ("GpuLost", "firing"), ("GpuLost", "resolved")]
        # repeat_interval still applies: the group is reminded once it has elapsed.
        clock.advance(4 * 3600)
        d.update([throttled])
        await settle(d, sink, 4)
        assert sink.requests[3].json["alerts"][0]["labels"]["alertname"] == "GpuThrottled"
    finally:
        await d.stop()


async def test_no_resolution_for_an_alert_never_shown(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    """Inhibited while it fired, then resolved: the receiver never heard of it, so no "resolved" either."""
    d = await make_dispatcher(cfg(sink, group_wait="0s", group_interval="30s"), tmp_path, clock)
    try:
        lost = mk_alert("GpuLost", severity="critical", t=clock.now())
        xid = mk_alert("GpuXidError", severity="critical", t=clock.now())
        d.update([lost, xid])
        await settle(d, sink, 1)
        # Both end together (the GPU came back at a new index: new labels, so the old Xid alert resolves): once
        # GpuLost no longer inhibits, the Xid alert's resolution is no longer muted, but it was never shown firing.
        clock.advance(60)
        xid_again = mk_alert("GpuXidError", severity="critical", gpu="1", t=clock.now())
        d.update([resolved(lost, clock.now()), resolved(xid, clock.now()), xid_again])
        await settle(d, sink, 3)
        await idle(d)
        got = sorted(
            (a["labels"]["alertname"], a["labels"]["gpu"], a["status"]) for r in sink.requests for a in r.json["alerts"]
        )
        assert got == [("GpuLost", "0", "firing"), ("GpuLost", "0", "resolved"), ("GpuXidError", "1", "firing")]
    finally:
        await d.stop()


async def test_send_resolved_false_sends_no_resolution(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    config = notify_config([receiver("hook", "webhook", sink.url, send_resolved=False)], group_wait="0s")
    d = await make_dispatcher(config, tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        d.update([a])
        await settle(d, sink, 1)
        clock.advance(300)
        d.update([resolved(a, clock.now())])
        clock.advance(300)
        d.update([a])  # fires again: the log forgot the old firing set, so this is news
        await settle(d, sink, 2)
        assert [r.json["status"] for r in sink.requests] == ["firing", "firing"]
    finally:
        await d.stop()


async def test_restart_does_not_resend_delivered(sink: Sink, tmp_path: Path, clock: ManualClock) -> None:
    config = cfg(sink, group_wait="0s")
    d = await make_dispatcher(config, tmp_path, clock)
    a = mk_alert(t=clock.now())
    d.update([a])
    await settle(d, sink, 1)
    await d.stop()
    clock.advance(60)
    d2 = await make_dispatcher(config, tmp_path, clock)
    try:
        d2.update([a])
        await idle(d2)
        assert len(sink.requests) == 1
        clock.advance(60)
        d2.update([resolved(a, clock.now())])  # the new process still knows the receiver was told it fired
        clock.advance(240)  # the resolution goes out on the group's next group_interval tick
        d2.flush_due()
        await settle(d2, sink, 2)
        assert sink.requests[1].json["status"] == "resolved"
    finally:
        await d2.stop()


async def test_reconfigure_moves_delivery_to_the_new_receiver(tmp_path: Path, clock: ManualClock) -> None:
    from .conftest import start_sink

    (old, r1), (new, r2) = [await start_sink(f"/h{i}") for i in range(2)]
    d = await make_dispatcher(notify_config([receiver("a", "webhook", old.url)], group_wait="0s"), tmp_path, clock)
    try:
        a = mk_alert(t=clock.now())
        d.update([a])
        await settle(d, old, 1)
        d.reconfigure(notify_config([receiver("b", "webhook", new.url)], group_wait="0s"))
        b = mk_alert(uuid=UUID1, gpu="1", t=clock.now())
        d.update([a, b])
        await settle(d, new, 2)  # b is a new receiver: it hears of both alerts once
        await idle(d)
        assert len(old.requests) == 1
        assert sorted(r.json["commonLabels"]["uuid"] for r in new.requests) == sorted([UUID0, UUID1])
    finally:
        await d.stop()
        await r1.cleanup()
        await r2.cleanup()
