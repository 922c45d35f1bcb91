"""Message text and each service's limits (pure renderers)."""

from __future__ import annotations

import json

from gpuwatchd.notify import alertmanager, discord, mattermost, slack, teams, webhook
from gpuwatchd.notify.format import ELLIPSIS, render_sparkline, sparkline, title, truncate
from gpuwatchd.notify.notification import Notification, sort_alerts
from gpuwatchd.notify.routing import group_key, routes_for

from .conftest import HOST, UUID0, mk_alert, notify_config, resolved

T = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def note(alerts: list, **kw: object) -> Notification:  # type: ignore[type-arg]
    route = routes_for(alerts[0].labels, notify_config([{"name": "r", "type": "webhook", "url": "https://x/y"}]))[0]
    glabels = {"alertname": alerts[0].name, "host": HOST, "uuid": UUID0}
    return Notification(
        receiver="r",
        group_key=group_key(route, glabels),
        group_labels=glabels,
        alerts=sort_alerts(alerts),
        host=HOST,
        now=T + 60,
        **kw,
    )  # type: ignore[arg-type]


def test_truncate_counts_characters_not_bytes() -> None:
    s = "温度" * 10  # 3 bytes each in UTF-8
    assert truncate(s, 20) == s
    cut = truncate(s, 7)
    assert len(cut) == 7 and cut.endswith(ELLIPSIS) and cut[:6] == s[:6]
    assert truncate("abc", 0) == ""


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert len(sparkline(list(range(100)))) == 24
    assert render_sparkline("1, 2 3,4") == "▁▃▆█"
    assert render_sparkline("▁▂▃") == "▁▂▃"  # already drawn by the rules: shown as is


def test_exact_slack_message_for_one_alert() -> None:
    a = mk_alert(
        "GpuMemoryLeak",
        t=T,
        summary="GPU memory grows 11.4 MiB/s; full in 12 min",
        annotations={"sparkline": "1,2,3,4,5,6,7,8"},
        extra={"pid": "4242", "process": "python"},
    )
    body = slack.render(note([a]))
    expected_alert = (
        "*WARNING* GpuMemoryLeak: GPU memory grows 11.4 MiB/s; full in 12 min\n"
        "GPU: GPU 0 · NVIDIA A100-SXM4-80GB · GPU-0a1b2c3d · pid 4242 (python)\n"
        "Trend: ▁▂▃▄▅▆▇█\n"
        "GpuMemoryLeak description\n"
        "Since: 2023-11-14 22:13:20 UTC\n"
        'Silence: POST /api/v1/silences with alertname="GpuMemoryLeak", host="gpu-host-1", uuid="'
        + UUID0
        + '", pid="4242"'
    )
    head = "[FIRING] GpuMemoryLeak on gpu-host-1 — GPU 0 · NVIDIA A100-SXM4-80GB · GPU-0a1b2c3d · pid 4242 (python)"
    assert body["text"] == f"{head}\n\n{expected_alert}"
    assert body["blocks"][0] == {"type": "header", "text": {"type": "plain_text", "text": head}}
    assert body["blocks"][1]["text"]["text"] == expected_alert


def test_title_counts_and_resolved() -> None:
    a, b = mk_alert(t=T), mk_alert(t=T, uuid="GPU-other", gpu="1")
    assert title(note([a, b])) == "[FIRING:2] GpuThrottled on gpu-host-1"
    assert title(note([resolved(a, T + 30)])).startswith("[RESOLVED] GpuThrottled on gpu-host-1 — GPU 0")


def many(n: int, text_len: int) -> Notification:
    return note([mk_alert(t=T, uuid=f"GPU-{i:04d}", gpu=str(i), summary="x" * text_len) for i in range(n)])


def test_slack_limits() -> None:
    body = slack.render(many(120, 5000))
    assert len(body["blocks"]) <= slack.MAX_BLOCKS
    assert all(len(b["text"]["text"]) <= slack.SECTION_TEXT_LIMIT for b in body["blocks"] if b["type"] == "section")
    assert len(body["blocks"][0]["text"]["text"]) <= slack.HEADER_TEXT_LIMIT
    assert len(body["text"]) == slack.TEXT_LIMIT and body["text"].endswith(ELLIPSIS)
    assert body["blocks"][-1]["elements"][0]["text"] == "…and 72 more alerts"


def test_discord_limits() -> None:
    body = discord.render(many(30, 3000))
    embeds = body["embeds"]
    assert 1 <= len(embeds) <= discord.MAX_EMBEDS
    assert all(len(e["title"]) <= discord.EMBED_TITLE_LIMIT for e in embeds)
    assert all(len(e["description"]) <= discord.EMBED_DESCRIPTION_LIMIT for e in embeds)
    assert sum(len(e["title"]) + len(e["description"]) for e in embeds) <= discord.EMBEDS_TOTAL_LIMIT
    assert len(body["content"]) <= discord.CONTENT_LIMIT
    assert body["allowed_mentions"] == {"parse": []}
    big = discord.render(note([mk_alert(t=T, summary="y" * 9000)]))
    assert len(big["embeds"][0]["description"]) == discord.EMBED_DESCRIPTION_LIMIT


def test_teams_card_envelope_and_limit() -> None:
    body = teams.render(many(40, 2000))
    [att] = body["attachments"]
    assert body["type"] == "message" and att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard" and card["body"][0]["color"] == "Warning"
    assert len(card["body"][1]["text"]) == teams.TEXT_LIMIT
    assert len(json.dumps(body, ensure_ascii=False).encode()) < 28 * 1024
    ok = teams.render(note([resolved(mk_alert(t=T), T + 5)]))
    assert ok["attachments"][0]["content"]["body"][0]["color"] == "Good"


def test_mattermost_limit() -> None:
    body = mattermost.render(many(20, 2000))
    assert len(body["text"]) == mattermost.TEXT_LIMIT
    assert body["text"].startswith("#### [FIRING:20] GpuThrottled on gpu-host-1\n**WARNING** GpuThrottled")


def test_webhook_v4_payload() -> None:
    a, b = mk_alert(t=T), mk_alert(t=T, uuid="GPU-other", gpu="1")
    body = webhook.render(note([resolved(b, T + 30), a], reason="some alerts resolved", external_url="http://h:9945"))
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "r"
    assert body["groupKey"] == '{}:{alertname="GpuThrottled", host="gpu-host-1", uuid="' + UUID0 + '"}'
    first, second = body["alerts"]
    assert first["status"] == "firing" and first["endsAt"] == "0001-01-01T00:00:00Z"
    assert first["startsAt"] == "2023-11-14T22:13:20.000Z" and first["fingerprint"] == a.fingerprint
    assert second["status"] == "resolved" and second["endsAt"] == "2023-11-14T22:13:50.000Z"
    assert first["generatorURL"] == "http://h:9945/api/v1/alerts"
    assert body["commonLabels"] == {k: v for k, v in a.labels.items() if k not in ("uuid", "gpu")}
    assert body["commonAnnotations"] == {"description": "GpuThrottled description"}
    all_resolved = webhook.render(note([resolved(a, T + 1)]))
    assert all_resolved["status"] == "resolved"
    # RFC 2104 HMAC-SHA256 test vector (key "key", the quick brown fox), as published on Wikipedia's HMAC page.
    fox = b"The quick brown fox jumps over the lazy dog"
    assert webhook.signature(fox, "key") == "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"


def test_alertmanager_postable_alerts() -> None:
    a = mk_alert(t=T)
    r = resolved(mk_alert(t=T, uuid="GPU-other"), T + 100)
    out = alertmanager.render([a, r], now=T + 200, resend=60)
    assert out[0]["endsAt"] == "2023-11-14T22:20:40.000Z"  # now (T + 200) + 4 x 60 s
    assert out[1]["endsAt"] == "2023-11-14T22:15:00.000Z"  # the resolution time
    assert set(out[0]) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert alertmanager.alerts_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alertmanager.alerts_url("http://am:9093/prefix/api/v2/alerts") == "http://am:9093/prefix/api/v2/alerts"
