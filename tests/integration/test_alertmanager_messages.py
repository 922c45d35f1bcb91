"""Fleet messages keep the daemon's advice (issue 28 §7): a real Alertmanager (Debian `prometheus-alertmanager`) runs
deploy/alertmanager/alertmanager.yml (its Slack receiver and templates as shipped; only the webhook URL file and the
timings changed, as in the fleet test) and posts to a local HTTP server playing Slack's incoming webhook.

A `gpuwatchd sim` host with the fleet host config (deploy/gpuwatchd/fleet.yml) sends its alerts to that Alertmanager:
when its eGPU's dock is pulled, the chat message Alertmanager sends carries what the daemon's own message would (the
summary, the GPU, the advice, since when) and a link to Alertmanager's silence form whose filter silences exactly
that alert on a real Alertmanager; the resolution says so and has no silence link. An alert posted with an `action`
annotation has it rendered too. The daemon's receiver lists a second, dead member (nothing listens on its port):
/api/v1/status and the status page (headless Chromium) show each member with its own health and last error, and a
real Prometheus scraping the daemon with the fleet rules (deploy/prometheus/gpuwatchd-fleet.rules.yml, `for:` holds
of 3 s) raises GpuwatchdNotificationsFailing for that member only. Loopback only; every process is started here and
stopped here.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, START_SECONDS, free_port, wait_until
from test_fleet import Chat, Host, Proc, alertmanager_config, http_json, http_ok, spawn, start_chat, start_sim

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(ALERTMANAGER is None or PROMETHEUS is None,
                                reason="needs Debian's prometheus-alertmanager and prometheus (.ci/run)")
FLEET_RULES = ROOT / "deploy" / "prometheus" / "gpuwatchd-fleet.rules.yml"
EVENT_SECONDS = 120.0  # liveness bound on a loaded machine; each wait returns as soon as its condition holds
HOST = Host("gpu-a", "egpu-unplug", 4)  # the dock is pulled at 58 s (GpuRemoved), re-plugged at 120 s (resolved)


@dataclass
class Kit:
    chat: Chat
    am: str
    daemon: str
    procs: list[Proc]
    dead: str  # the receiver's second member: a port nothing listens on
    prometheus: str

    def texts(self, title_prefix: str) -> list[str]:
        with self.chat.lock:
            return [a.get("text", "") for m in self.chat.messages for a in m.get("attachments", [])
                    if a.get("title", "").startswith(title_prefix)]  # fmt: skip

    def wait(self, cond: Any, what: str, timeout: float = EVENT_SECONDS) -> Any:
        try:
            return wait_until(cond, what, timeout)
        except AssertionError:
            tails = "\n".join(f"--- {p.name}\n{p.log()}" for p in self.procs)
            raise AssertionError(f"timed out waiting for {what}; chat got {self.chat.titles()}\n{tails}") from None


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    tmp = tmp_path_factory.mktemp("am-messages")
    logs = tmp / "logs"
    logs.mkdir()
    chat = start_chat()
    am_port, sim_port, prom_port = free_port(), free_port(), free_port()
    am, dead = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{free_port()}"
    procs: list[Proc] = []
    try:
        procs.append(spawn("alertmanager", [
            str(ALERTMANAGER), f"--config.file={alertmanager_config(tmp, chat)}", f"--storage.path={tmp / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}", f"--web.external-url={am}", "--cluster.listen-address=",
        ], logs))  # fmt: skip
        procs.append(start_sim(tmp, logs, HOST, sim_port, [am, dead]))
        rules = yaml.safe_load(FLEET_RULES.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "3s"
        (tmp / "fleet.rules.yml").write_text(yaml.safe_dump(rules))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "fleet.rules.yml")],
            "scrape_configs": [{"job_name": "gpuwatchd", "static_configs": [
                {"targets": [f"127.0.0.1:{sim_port}"], "labels": {"host": HOST.name}}],
                "metric_relabel_configs": [{"action": "labeldrop", "regex": "exported_host"}]}],
        }))  # fmt: skip
        procs.append(spawn("prometheus", [
            str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ], logs))  # fmt: skip
        k = Kit(chat, am, f"http://127.0.0.1:{sim_port}", procs, dead, f"http://127.0.0.1:{prom_port}")

        def ready() -> bool:
            for p in procs:
                p.alive()
            return http_ok(f"{am}/-/ready") and http_ok(f"{k.daemon}/healthz") and http_ok(f"{k.prometheus}/-/ready")

        k.wait(ready, "Alertmanager and the daemon to serve", START_SECONDS)
        yield k
    finally:
        for p in reversed(procs):
            p.stop()
        chat.server.shutdown()
        chat.server.server_close()


def silence_filter(text: str, am: str) -> str:
    """The matchers of the message's silence link (Alertmanager's `#/silences/new?filter={...}`)."""
    m = re.search(rf"^Silence: {re.escape(am)}/#/silences/new\?filter=(\S+)$", text, re.M)
    assert m is not None, text
    return urllib.parse.unquote_plus(m.group(1))


def post(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def test_the_fleet_message_has_the_daemons_advice_and_a_silence_link(kit: Kit) -> None:
    title = f"[FIRING] GpuRemoved on {HOST.name} GPU 0"
    [text] = kit.wait(lambda: kit.texts(title), "the GpuRemoved message in the chat")
    alerts = http_json(f"{kit.daemon}/api/v1/alerts") or []
    [alert] = [a for a in alerts if a["labels"]["alertname"] == "GpuRemoved"]
    labels, ann = alert["labels"], alert["annotations"]
    lines = text.splitlines()
    assert lines[0] == f"*{labels['severity'].upper()}* GpuRemoved: {ann['summary']}"
    assert lines[1].startswith(f"GPU: {labels['gpu']} · {labels['model']} · {labels['uuid'][:12]}")
    # The advice, as the daemon words it: the dock was pulled, re-plug it, no reboot needed.
    assert ann["description"] in lines
    assert f"What to do: {ann['action']}" in lines and "Re-plug the dock" in ann["action"]
    assert any(line.startswith("Since: ") and line.endswith(" UTC") for line in lines)
    # The link's filter is this alert on this host and GPU, the daemon's silence keys.
    matchers = silence_filter(text, kit.am)
    want = ", ".join(f'{k}="{labels[k]}"' for k in ("alertname", "host", "uuid", "unique_id", "pid") if labels.get(k))
    assert matchers == "{" + want + "}"
    # ... and silences exactly it on the real Alertmanager.
    now = datetime.now(timezone.utc)
    parsed = []
    for m in matchers.strip("{}").split(", "):
        name, value = m.split("=", 1)
        parsed.append({"name": name, "value": json.loads(value)})
    silence = post(f"{kit.am}/api/v2/silences", {
        "matchers": [{**m, "isRegex": False, "isEqual": True} for m in parsed], "createdBy": "test",
        "comment": "from the chat message's link", "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
    })  # fmt: skip

    def silenced() -> dict[str, list[str]] | None:
        out = {}
        for a in http_json(f"{kit.am}/api/v2/alerts?silenced=true&inhibited=true") or []:
            out[a["labels"]["alertname"]] = a["status"]["silencedBy"]
        return out if out.get("GpuRemoved") else None

    muted = kit.wait(silenced, "the link's silence to mute the alert")
    assert muted["GpuRemoved"] == [silence["silenceID"]]
    assert all(not ids for name, ids in muted.items() if name != "GpuRemoved"), muted
    # Expired again: a silenced alert's resolution is muted too, and the next test reads it.
    req = urllib.request.Request(f"{kit.am}/api/v2/silence/{silence['silenceID']}", method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


@pytest.mark.timeout(600)  # a hang guard above the wait: the scenario re-plugs the dock at 120 s (30 s of wall time)
def test_the_resolution_says_so_without_a_silence_link(kit: Kit) -> None:
    # Re-plugged at 120 s: the daemon resolves the alert and Alertmanager sends the resolution it had notified.
    prefix = f"[RESOLVED] GpuRemoved on {HOST.name}"
    texts = kit.wait(lambda: kit.texts(prefix), "the GpuRemoved resolution in the chat", 2 * EVENT_SECONDS)
    assert texts[0].startswith("*RESOLVED* GpuRemoved: ") and " · resolved " in texts[0]
    assert "Silence:" not in texts[0]


def test_an_action_annotation_is_rendered(kit: Kit) -> None:
    now = datetime.now(timezone.utc)
    post(f"{kit.am}/api/v2/alerts", [{
        "labels": {"alertname": "GpuEccError", "severity": "critical", "host": "gpu-z", "gpu": "3",
                   "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555", "model": "NVIDIA A100"},
        "annotations": {"summary": "GPU 3: 2 uncorrectable ECC errors", "description": "Uncorrectable ECC errors.",
                        "action": "Drain the node, then reset the GPU (nvidia-smi -r -i 3)."},
        "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=5)).isoformat(),
    }])  # fmt: skip
    [text] = kit.wait(lambda: kit.texts("[FIRING] GpuEccError on gpu-z GPU 3"), "the posted alert in the chat")
    assert "What to do: Drain the node, then reset the GPU (nvidia-smi -r -i 3)." in text.splitlines()
    uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
    assert silence_filter(text, kit.am) == f'{{alertname="GpuEccError", host="gpu-z", uuid="{uuid}"}}'


def test_each_member_of_the_cluster_is_listed_with_its_own_health(kit: Kit, tmp_path_factory: pytest.TempPathFactory,
                                                                  ) -> None:  # fmt: skip
    def members() -> list[dict[str, Any]] | None:
        [rc] = (http_json(f"{kit.daemon}/api/v1/status") or {}).get("receivers", [{}])
        got = rc.get("members", [])
        return got if [m["health"] for m in got] == ["up", "failing"] else None

    live, dead = kit.wait(members, "the live member up and the dead one failing in /api/v1/status")
    assert (live["name"], live["index"], live["last_error"]) == ("fleet", 0, None)
    assert (dead["name"], dead["index"]) == ("fleet#1", 1)
    assert dead["last_error"].startswith("alertmanager:fleet#1: ") and dead["last_delivered"] is None
    assert kit.dead not in json.dumps(dead) and kit.am not in json.dumps(live)  # named, never by URL

    pw = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright")
    from test_status_page import CHROMIUM, CHROMIUM_ARGS, DESKTOP, open_page

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (.ci/run installs Debian's chromium)")
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx, page, log = open_page(browser, kit.daemon, DESKTOP)
            page.wait_for_selector("#receivers li.member.failing")
            rows = page.locator("#receivers li.member")
            assert rows.count() == 2
            up_text = rows.nth(0).inner_text().lower()  # the badge is upper-cased by CSS
            down_text = rows.nth(1).inner_text().lower()
            assert up_text.startswith("up") and "urls[0] (fleet)" in up_text and "last delivered" in up_text
            assert down_text.startswith("failing") and "urls[1] (fleet#1)" in down_text
            assert dead["last_error"].split(": ", 1)[0].lower() in down_text
            shot = tmp_path_factory.mktemp("screenshots") / "receivers-members.png"
            page.locator("#receivers").screenshot(path=str(shot))
            print(f"screenshot: {shot}")
            assert log.errors == []
            ctx.close()
        finally:
            browser.close()


def test_prometheus_says_which_member_fails(kit: Kit) -> None:
    def firing() -> list[dict[str, Any]] | None:
        q = urllib.parse.urlencode({"query": 'ALERTS{alertname="GpuwatchdNotificationsFailing", alertstate="firing"}'})
        doc = http_json(f"{kit.prometheus}/api/v1/query?{q}") or {}
        return (doc.get("data") or {}).get("result") or None

    [alert] = kit.wait(firing, "GpuwatchdNotificationsFailing for the dead member")
    assert alert["metric"]["receiver"] == "fleet#1" and alert["metric"]["host"] == HOST.name
    q = urllib.parse.urlencode({"query": 'ALERTS{alertname="GpuwatchdNoReceivers"}'})
    assert (http_json(f"{kit.prometheus}/api/v1/query?{q}") or {})["data"]["result"] == []
