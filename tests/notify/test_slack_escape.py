"""Slack mrkdwn under hostile alert text, through the real delivery path to a real HTTP sink: a process name
``<!channel>`` must not ping the channel, ``<https://evil|details>`` must not become a link saying something else
than where it goes (Slack's "Escaping text": ``&``, ``<``, ``>`` as entities in every mrkdwn field)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpuwatchd.notify import slack
from gpuwatchd.runtime.clock import ManualClock

from .conftest import Sink, make_dispatcher, mk_alert, notify_config, receiver, settle

NAME = "<!channel> <https://evil.example/|details> & <@U024BE7LH>"


async def test_hostile_process_names_reach_slack_as_text(sink: Sink, tmp_path: Path) -> None:
    clock = ManualClock()
    config = notify_config([receiver("team", "slack", sink.url)], group_wait="0s", group_interval="1s")
    d = await make_dispatcher(config, tmp_path, clock)
    leak = mk_alert("GpuMemoryLeak", severity="critical", t=clock.now(), summary=f"pid 4242 ({NAME}) grows",
                    extra={"pid": "4242", "process": NAME})
    try:
        d.update([leak])
        (req,) = await settle(d, sink, 1)
        body = json.loads(req.body)
        mrkdwn = [body["text"]] + [b["text"]["text"] for b in body["blocks"] if b["type"] == "section"]
        for text in mrkdwn:
            assert re.search(r"<[!@h]", text) is None, text  # no mention, no link markup left
            assert "&lt;!channel&gt; &lt;https://evil.example/|details&gt; &amp; &lt;@U024BE7LH&gt;" in text
        assert "(<!channel> <https://evil.example/|details> &" in body["blocks"][0]["text"]["text"]  # plain_text
    finally:
        await d.stop()


def test_a_cut_never_leaves_half_an_entity() -> None:
    for n in range(1, 12):
        text = "x" * (40 - n) + "<" * 10
        cut = slack._cut_escaped(text, 40)
        assert len(cut) <= 40 and re.search(r"&[a-z]*…$", cut) is None, cut
