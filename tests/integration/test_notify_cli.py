"""Notifications a user can set up and trust (issue 17 part 4), through the real commands and a real daemon:
`gpuwatchd notify test` against real HTTP servers playing Slack (one that takes the message, one that refuses it),
`gpuwatchd silence add|list|expire` against `gpuwatchd sim`, the silence form the chat messages link to, and what
`run` says at start when no receiver is configured and when it listens beyond loopback without TLS or auth.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from support import ROOT, START_SECONDS, DaemonProcess, free_port, metrics_when, value, wait_until
from test_sim_cli import interrupt, start_sim
from test_sim_incidents import Slack

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gpuwatchd(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line's entry point, in this process (an interpreter start per call would cost CI seconds)."""
    from gpuwatchd.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["gpuwatchd", *args], code, out.getvalue(), err.getvalue())


class RefusingSlack(Slack):
    """Slack answering a bad payload as it does: HTTP 400 with a short text body."""

    async def _start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(status=400, text="invalid_token")

        app = web.Application()
        app.router.add_post("/services/T000/B000/XXXX", hook)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def test_notify_test_reports_each_receiver(tmp_path: Path) -> None:
    good, bad = Slack(), RefusingSlack()
    try:
        cfg = tmp_path / "g.yml"
        cfg.write_text(yaml.safe_dump({"host": "desk", "notify": {"receivers": [
            {"name": "team", "type": "slack", "url": good.url},
            {"name": "old", "type": "slack", "url": bad.url},
        ]}}))  # fmt: skip
        r = gpuwatchd("notify", "test", "--config", str(cfg))
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("team (slack): OK: HTTP 200 in ") and lines[0].endswith(" ms"), lines
        assert lines[1].startswith("old (slack): FAILED: HTTP 400 after "), lines
        assert lines[1].endswith("slack:old: HTTP 400: invalid_token"), lines  # the service's own words
        assert "XXXX" not in r.stdout + r.stderr  # the webhook URL is a secret
        (_, body), = good.messages
        assert "test notification" in body["text"] and "desk" in body["text"]
        # Only the named receiver: the good one alone succeeds.
        r = gpuwatchd("notify", "test", "--config", str(cfg), "--receiver", "team")
        assert (r.returncode, len(r.stdout.splitlines())) == (0, 1), r.stdout + r.stderr
        r = gpuwatchd("notify", "test", "--config", str(cfg), "--receiver", "nope")
        assert r.returncode == 2 and "unknown receiver 'nope'" in r.stderr and "team, old" in r.stderr
    finally:
        good.close()
        bad.close()


def test_notify_test_without_receivers_says_so(tmp_path: Path) -> None:
    cfg = tmp_path / "none.yml"
    cfg.write_text("host: desk\n")
    r = gpuwatchd("notify", "test", "--config", str(cfg))
    assert r.returncode == 2 and "no receivers" in r.stderr and "alerts go nowhere but the API" in r.stderr


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """An idle sim with no receiver, listening on every interface (reached through 127.0.0.1 only)."""
    tmp = tmp_path_factory.mktemp("notify-cli")
    port = free_port()
    cfg = tmp / "g.yml"
    cfg.write_text(yaml.safe_dump({"notify": {"external_url": f"http://127.0.0.1:{port}"}}))
    log_path = tmp / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", "--scenario", "idle", "--config", str(cfg),
             "--listen", f"0.0.0.0:{port}"],  # the exposure warning is what is tested
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
        )  # fmt: skip
    d = DaemonProcess(proc, f"http://127.0.0.1:{port}", cfg, log_path)

    def serving() -> bool:
        assert proc.poll() is None, d.log()
        try:
            return d.get("/healthz", timeout=1)[0] == 200
        except OSError:
            return False

    try:
        wait_until(serving, "gpuwatchd sim to serve", START_SECONDS)
        yield d
        assert interrupt(d) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_says_once_that_alerts_go_nowhere(sim: DaemonProcess) -> None:
    samples = metrics_when(sim, lambda m: value(m, "gpuwatchd_notify_receivers") is not None, "notify_receivers")
    assert value(samples, "gpuwatchd_notify_receivers") == 0
    assert sim.log().count("alerts go nowhere but the API") == 1


def test_run_says_what_is_exposed_beyond_loopback(sim: DaemonProcess) -> None:
    lines = [ln for ln in sim.log().splitlines() if "without TLS or basic auth" in ln]
    assert len(lines) == 1, sim.log()
    assert "processes on them (names, pids, users)" in lines[0] and "docs/security.md" in lines[0]


def test_silence_add_list_expire(sim: DaemonProcess) -> None:
    url = ["--url", sim.url]
    r = gpuwatchd("silence", "add", 'alertname="GpuThrottled"', "uuid=GPU-0", "--for", "90m",
                  "--comment", "fan swap", "--author", "erin", *url)  # fmt: skip
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert len(sid) == 32 and 'uuid="GPU-0"' in r.stderr
    r = gpuwatchd("silence", "list", *url)
    line, = [ln for ln in r.stdout.splitlines() if ln.startswith(sid)]
    assert "active" in line and 'alertname="GpuThrottled", uuid="GPU-0"' in line and "by erin — fan swap" in line
    assert "1h2" in line or "1h3" in line  # about 1h30m left
    r = gpuwatchd("silence", "list", "--json", *url)
    (s,) = [x for x in json.loads(r.stdout) if x["id"] == sid]
    assert (s["createdBy"], s["comment"], s["status"]["state"]) == ("erin", "fan swap", "active")
    r = gpuwatchd("silence", "expire", sid, *url)
    assert (r.returncode, r.stdout.strip()) == (0, f"{sid} expired")
    assert sid not in gpuwatchd("silence", "list", *url).stdout
    assert sid in gpuwatchd("silence", "list", "--all", *url).stdout
    # Refusals are the daemon's words, exit 1; no daemon is exit 3; a bad duration is a usage error.
    r = gpuwatchd("silence", "add", 'alertname=~".*"', *url)
    assert r.returncode == 1 and "refused (HTTP 400)" in r.stderr
    r = gpuwatchd("silence", "expire", "0" * 32, *url)
    assert r.returncode == 1 and "404" in r.stderr
    assert gpuwatchd("silence", "add", "uuid=GPU-0", "--for", "soon", *url).returncode == 2
    r = gpuwatchd("silence", "list", "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 3 and "no daemon reachable" in r.stderr


def test_silence_link_opens_a_form_that_silences(sim: DaemonProcess) -> None:
    from gpuwatchd.model import Alert
    from gpuwatchd.notify.format import alert_text

    alert = Alert("GpuLost", "critical", {"alertname": "GpuLost", "host": "desk", "uuid": "GPU-9", "gpu": "0"},
                  "lost", "", "firing", 1.0, fired_at=1.0)  # fmt: skip
    text = alert_text(alert, external_url=sim.url)
    link = text.splitlines()[-1].removeprefix("Silence: ")
    assert link == f"{sim.url}/silences/new?alertname=GpuLost&host=desk&uuid=GPU-9"
    assert "POST /api/v1/silences" in alert_text(alert)  # without an external URL: the API call
    status, page = sim.get(link.removeprefix(sim.url))
    assert status == 200 and 'uuid=&quot;GPU-9&quot;' in page and "<form method=post" in page
    import re

    token = re.search(r'name=csrf_token value="([^"]+)"', page)
    assert token is not None, page  # the form carries its CSRF token (cross_site.py)
    form = {"alertname": "GpuLost", "host": "desk", "uuid": "GPU-9", "duration": "4h", "author": "erin",
            "comment": "re-seating the riser", "csrf_token": token.group(1)}  # fmt: skip
    data = urllib.parse.urlencode(form).encode()

    def post(origin: str, data: bytes = data) -> tuple[int, str]:
        req = urllib.request.Request(f"{sim.url}/silences/new", data=data, headers={"Origin": origin})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert post("https://evil.example")[0] == 403  # a form on another site cannot silence through the browser
    forged = urllib.parse.urlencode({**form, "csrf_token": "9999999999." + "0" * 64}).encode()
    assert post(sim.url, forged)[0] == 403  # nor a same-origin post without the page's token
    status, page = post(sim.url)
    assert status == 200 and "Silenced until" in page, page
    listing = json.loads(sim.get("/api/v1/silences")[1])
    (s,) = [x for x in listing if x["comment"] == "re-seating the riser"]
    assert {m["name"]: m["value"] for m in s["matchers"]} == {"alertname": "GpuLost", "host": "desk", "uuid": "GPU-9"}
    assert s["createdBy"] == "erin"


def test_notify_test_of_the_running_daemon(tmp_path: Path) -> None:
    # `--url`: the daemon's own receivers (POST /api/v1/receivers/test), as its config has them now.
    good = Slack()
    running: list[DaemonProcess] = []
    try:
        cfg = tmp_path / "g.yml"
        cfg.write_text(yaml.safe_dump({"host": "desk", "notify": {"receivers": [
            {"name": "team", "type": "slack", "url": good.url}]}}))  # fmt: skip
        d = start_sim(running, tmp_path, "--scenario", "idle", "--config", str(cfg))
        r = gpuwatchd("notify", "test", "--url", d.url)
        assert r.returncode == 0 and r.stdout.startswith("team (slack): OK: HTTP 200 in "), r.stdout + r.stderr
        (_, body), = good.messages
        assert "test notification" in body["text"]
        r = gpuwatchd("notify", "test", "--url", d.url, "--receiver", "nope")
        assert r.returncode == 2 and "unknown receiver 'nope'" in r.stderr
        assert interrupt(d) == 0
    finally:
        for p in running:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        good.close()


def test_notify_test_of_a_daemon_without_receivers(sim: DaemonProcess) -> None:
    r = gpuwatchd("notify", "test", "--url", sim.url)
    assert r.returncode == 2 and "the daemon has no receivers" in r.stderr


def test_silence_form_shell_hint_is_quoted_for_a_shell(sim: DaemonProcess) -> None:
    """The form's "from a shell on this host" command is built from the link's query: a value with ``$(...)``,
    a backquote or a quote is quoted so that pasting the command runs nothing and silences exactly those labels."""
    import html
    import re
    import shlex

    evil = {"alertname": 'GpuLost"; $(touch /tmp/pwned) `id`', "uuid": "GPU-9' $(id)"}
    status, page = sim.get("/silences/new?" + urllib.parse.urlencode(evil))
    assert status == 200
    m = re.search(r"<code>gpuwatchd silence add (.*?) --for 2h --comment \.\.\.</code>", page)
    assert m is not None, page
    argv = shlex.split(html.unescape(m.group(1)))
    assert argv == ['alertname="GpuLost\\"; $(touch /tmp/pwned) `id`"', "uuid=\"GPU-9' $(id)\""]
    r = gpuwatchd("silence", "add", *argv, "--for", "1h", "--author", "erin", "--url", sim.url)
    assert r.returncode == 0, r.stderr
    (s,) = [x for x in json.loads(sim.get("/api/v1/silences")[1]) if x["id"] == r.stdout.strip()]
    assert {x["name"]: x["value"] for x in s["matchers"]} == evil
