"""The ntfy receiver: a text body with Title/Priority/Tags/Click headers, through the real delivery path to a real
HTTP server playing ntfy."""

from __future__ import annotations

from email.header import decode_header, make_header
from pathlib import Path

from gpuwatchd.notify import ntfy
from gpuwatchd.notify.notification import Notification
from gpuwatchd.runtime.clock import ManualClock

from .conftest import HOST, Sink, make_dispatcher, mk_alert, notify_config, receiver, resolved, settle
from .test_delivery import metric


def _decoded(value: str) -> str:
    return str(make_header(decode_header(value)))


async def test_a_firing_and_a_resolved_message_as_ntfy_publishes(sink: Sink, tmp_path: Path) -> None:
    clock = ManualClock()
    config = notify_config(
        [receiver("phone", "ntfy", sink.url, headers={"Authorization": "Bearer tk_SECRETtoken"})],
        group_wait="0s", group_interval="1s", external_url="https://gpu-box.example:9945",
    )
    d = await make_dispatcher(config, tmp_path, clock)
    leak = mk_alert("GpuMemoryLeak", severity="critical", t=clock.now(),
                    summary="pid 4242 (python) grows 120 MiB/min: full in 41 min")
    try:
        d.update([leak])
        (req,) = await settle(d, sink, 1)
        assert req.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert req.headers["Authorization"] == "Bearer tk_SECRETtoken"  # the receiver's own headers still go
        assert req.headers["Priority"] == "5"
        assert req.headers["Tags"] == "rotating_light,GpuMemoryLeak"
        title = _decoded(req.headers["Title"])  # the em dash makes it an RFC 2047 encoded word
        assert title.startswith(f"[FIRING] GpuMemoryLeak on {HOST} — GPU 0") and req.headers["Title"].isascii()
        assert req.headers["Click"] == "https://gpu-box.example:9945/"
        text = req.body.decode()
        assert "CRITICAL GpuMemoryLeak: pid 4242 (python) grows 120 MiB/min: full in 41 min" in text
        assert "*" not in text.splitlines()[0]  # plain text: no Markdown markers
        clock.advance(60)
        d.update([resolved(leak, clock.now())])
        clock.advance(2)
        d.flush_due()
        reqs = await settle(d, sink, 2)
        assert reqs[1].headers["Priority"] == "2" and reqs[1].headers["Tags"].startswith("white_check_mark,")
        assert _decoded(reqs[1].headers["Title"]).startswith("[RESOLVED] GpuMemoryLeak")
    finally:
        await d.stop()


def test_non_ascii_titles_are_encoded_words_and_long_texts_are_cut() -> None:
    a = mk_alert("GpuThrottled", extra={"host": "büro-rechner"}, summary="x" * 10_000)
    n = Notification(receiver="phone", group_key="{}:{}", group_labels={}, alerts=(a,), host="büro-rechner",
                     now=a.active_at)
    cfg = notify_config([receiver("phone", "ntfy", "http://127.0.0.1:1/t")]).receivers[0]
    req = ntfy.request(ntfy.render(n), cfg, "http://127.0.0.1:1/t")
    title = req.headers["Title"]
    assert title.isascii() and title.startswith("=?utf-8?")  # RFC 2047: ntfy decodes it
    assert _decoded(title).startswith("[FIRING] GpuThrottled on büro-rechner")
    assert req.headers["Priority"] == "4" and req.headers["Tags"] == "warning,GpuThrottled"
    assert len(req.body) <= ntfy.MESSAGE_LIMIT_BYTES and req.body.decode().endswith("…")
    assert "Click" not in req.headers  # no external URL configured: no link to a page nobody can reach
    assert ntfy.cut_utf8("é" * 3000, 4096).decode()  # never cut inside a character


async def test_hostile_label_text_makes_one_line_headers_and_is_delivered_once(sink: Sink, tmp_path: Path) -> None:
    """A process name (from /proc, NVML or the kernel log) with CR/LF, ESC, a bidi override and 5000 characters
    reaches the Title header: it is delivered at the first attempt as one header line, nothing injected. Before,
    the LF reached the encoded word as a folded line, aiohttp refused the request and the message was retried
    until it expired."""
    clock = ManualClock()
    config = notify_config([receiver("phone", "ntfy", sink.url)], group_wait="0s", group_interval="1s")
    d = await make_dispatcher(config, tmp_path, clock)
    name = "evil\r\nX-Injected: 1\r\n\r\nbody\x1b[2J\u202egnp.exe" + "é" * 5000
    leak = mk_alert("GpuMemoryLeak", severity="critical", t=clock.now(), summary="grows",
                    extra={"pid": "4242", "process": name})
    try:
        d.update([leak])
        (req,) = await settle(d, sink, 1)
        assert "X-Injected" not in req.headers
        raw = req.headers["Title"]
        assert raw.isascii() and raw.isprintable() and len(raw) < 8 * ntfy.HEADER_LIMIT
        title = _decoded(raw)
        assert "pid 4242 (evil X-Injected: 1 body [2J gnp.exe" in title, title
        assert not any(c in title for c in "\r\n\x1b\u202e")
        assert metric(d, "gpuwatchd_notifications_total", receiver="phone", integration="ntfy",
                      outcome="success") == 1
        assert metric(d, "gpuwatchd_notifications_total", receiver="phone", integration="ntfy",
                      outcome="retry") == 0
    finally:
        await d.stop()
