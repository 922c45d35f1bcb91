"""Cross-site requests against a real ``gpuwatchd sim`` with no auth configured (the default): a page of another
loopback origin opened in a real headless Chromium (Debian's ``chromium`` driven by Playwright) that auto-submits
forms and fires no-cors fetches at every state-changing endpoint, and DNS-rebinding requests (Host and Origin both
an attacker's name) sent as raw HTTP. Nothing may be silenced, no test message sent; the daemon's own form page
and the CLI still work. Receiver tests count against the receiver's ``rate_limit_per_minute``."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import DaemonProcess
from test_sim_cli import interrupt, start_sim
from test_sim_incidents import Slack

from gpuwatchd.notify.cross_site import FORM_TOKEN_SECONDS

CHROMIUM = os.environ.get("GPUWATCHD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RATE = 6  # the receiver's rate_limit_per_minute
SILENCE = {"matchers": [{"name": "alertname", "value": "GpuLost", "isRegex": False, "isEqual": True}],
           "createdBy": "evil", "comment": "muted from another origin"}

playwright_api = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (.ci/run installs Debian's chromium)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Slack]]:
    """A sim with one Slack receiver limited to RATE a minute, no write token, no web config."""
    tmp = tmp_path_factory.mktemp("cross-site")
    slack = Slack()
    running: list[DaemonProcess] = []
    try:
        cfg = tmp / "g.yml"
        cfg.write_text(yaml.safe_dump({"host": "desk", "state_dir": str(tmp / "state"), "notify": {"receivers": [
            {"name": "team", "type": "slack", "url": slack.url, "rate_limit_per_minute": RATE}]}}))  # fmt: skip
        yield start_sim(running, tmp, "--scenario", "idle", "--config", str(cfg)), slack
        assert interrupt(running[0]) == 0
    finally:
        for p in running:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        slack.close()


class Attacker:
    """The other origin: a plain HTTP server on a loopback address serving the pages ``pages`` holds."""

    def __init__(self, host: str) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "not found").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        self.server = server_class((host, 0), Handler)
        port = self.server.server_address[1]
        self.origin = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _attack_pages(daemon: str) -> dict[str, str]:
    """Pages that try every way a browser can send a state change without a CORS preflight."""
    # text/plain form: the body is `name=value`, arranged to be the silence JSON (the classic JSON CSRF): the `=`
    # falls inside the comment's text.
    fields = {k: v for k, v in SILENCE.items() if k != "comment"}
    name = json.dumps(fields)[:-1] + ', "comment": "muted from another origin '
    text_plain = (f"<form method=post enctype=text/plain action='{daemon}/api/v1/silences'>"
                  f"<input name='{name}' value='by a form\"}}'></form>")
    form = (f"<form method=post action='{daemon}/silences/new'>"
            "<input name=alertname value=GpuLost><input name=duration value=1d><input name=author value=evil>"
            f"<input name=csrf_token value='{int(time.time() + FORM_TOKEN_SECONDS)}.{'0' * 64}'></form>")
    body = json.dumps(json.dumps(SILENCE))
    fetches = (
        "<script>(async () => {const d = " + json.dumps(daemon) + ";"
        "const tries = ["
        f"fetch(d + '/api/v1/silences', {{method: 'POST', mode: 'no-cors', body: {body}}}),"
        f"fetch(d + '/api/v1/silences', {{method: 'POST', mode: 'no-cors', body: new Blob([{body}])}}),"
        "fetch(d + '/api/v1/receivers/test', {method: 'POST', mode: 'no-cors'}),"
        "fetch(d + '/api/v1/probe', {method: 'POST', mode: 'no-cors'}),"
        "fetch(d + '/api/v1/silences', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        f" body: {body}}}),"
        "];"
        "for (const t of tries) { try { await t; } catch (e) {} }"
        "document.title = 'done';})();</script>"
    )  # fmt: skip
    submit = "<script>document.forms[0].submit()</script>"
    return {"/text-plain": text_plain + submit, "/form": form + submit, "/fetch": fetches}


def _silences(d: DaemonProcess) -> list[dict[str, Any]]:
    status, text = d.get("/api/v1/silences")
    assert status == 200
    return [s for s in json.loads(text) if s["status"]["state"] != "expired"]


@pytest.mark.parametrize("where", ["127.0.0.1", "::1"])
def test_a_page_of_another_origin_cannot_change_anything(
    browser: Any, setup: tuple[DaemonProcess, Slack], where: str
) -> None:
    d, slack = setup
    if where == "::1" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    attacker = Attacker(where)
    sent_before = len(slack.messages)
    try:
        attacker.pages.update(_attack_pages(d.url))
        page = browser.new_page()
        try:
            for path in ("/text-plain", "/form"):
                # The form submits itself: the browser leaves for the daemon's answer (a refusal).
                with page.expect_navigation(url=re.compile(re.escape(d.url)), timeout=60_000):
                    page.goto(attacker.origin + path)
                assert "refused" in page.content().lower(), page.content()
            page.goto(attacker.origin + "/fetch")
            page.wait_for_function("document.title === 'done'", timeout=60_000)
        finally:
            page.close()
    finally:
        attacker.close()
    assert _silences(d) == []
    assert len(slack.messages) == sent_before  # no receiver test went out
    assert "refused a cross-site write" in d.log()


def test_the_daemons_own_form_still_silences_in_the_browser(browser: Any, setup: tuple[DaemonProcess, Slack]) -> None:
    """The control of the test above: the same browser on the daemon's own page submits and silences."""
    d, _ = setup
    page = browser.new_page()
    try:
        page.goto(f"{d.url}/silences/new?alertname=GpuThrottled&uuid=GPU-7")
        page.fill("input[name=author]", "erin")
        page.fill("input[name=comment]", "fan swap")
        with page.expect_navigation(timeout=60_000):
            page.click("button[type=submit]")
        assert "Silenced until" in page.content(), page.content()
    finally:
        page.close()
    (s,) = [s for s in _silences(d) if s["comment"] == "fan swap"]
    assert s["createdBy"] == "erin"
    expire = subprocess.run([sys.executable, "-m", "gpuwatchd", "silence", "expire", s["id"], "--url", d.url],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert expire.returncode == 0, expire.stderr


def _raw(d: DaemonProcess, request: bytes) -> tuple[int, bytes]:
    """One request exactly as given (a DNS-rebinding page's browser sends its own name as Host and Origin)."""
    u = urllib.parse.urlsplit(d.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _request(method: str, path: str, host: str, origin: str | None, body: bytes = b"",
             content_type: str = "application/json") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", f"Content-Length: {len(body)}"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    if body:
        lines.append(f"Content-Type: {content_type}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_dns_rebinding_requests_are_refused(setup: tuple[DaemonProcess, Slack]) -> None:
    d, slack = setup
    port = urllib.parse.urlsplit(d.url).port
    evil = f"rebind.evil.example:{port}"
    body = json.dumps(SILENCE).encode()
    sent_before = len(slack.messages)
    for origin in (f"http://{evil}", None):
        status, answer = _raw(d, _request("POST", "/api/v1/silences", evil, origin, body))
        assert status == 403 and json.loads(answer)["field"] == "Host", answer
        status, answer = _raw(d, _request("POST", "/api/v1/receivers/test", evil, origin))
        assert status == 403, answer
        status, answer = _raw(d, _request("DELETE", "/api/v1/silences/" + "0" * 32, evil, origin))
        assert status == 403, answer
        form = urllib.parse.urlencode({"alertname": "GpuLost", "duration": "1d", "author": "evil"}).encode()
        status, answer = _raw(d, _request("POST", "/silences/new", evil, origin, form,
                                          "application/x-www-form-urlencoded"))
        assert status == 403, answer
    # The form page carries the CSRF token: it is not served under a foreign name either.
    status, answer = _raw(d, _request("GET", "/silences/new?alertname=GpuLost", evil, None))
    assert status == 403 and b"csrf_token" not in answer
    # Names that look local but are not, and an opaque origin.
    for host, origin in ((f"localhost.evil.example:{port}", None), (f"127.0.0.1.nip.io:{port}", None),
                         (f"127.0.0.1:{port}", "null"), (f"127.0.0.1:{port}", f"http://localhost:{port}")):
        status, answer = _raw(d, _request("POST", "/api/v1/silences", host, origin, body))
        assert status == 403, (host, origin, answer)
    # A JSON body must say so: a text/plain body is what a cross-origin form can send.
    status, answer = _raw(d, _request("POST", "/api/v1/silences", f"127.0.0.1:{port}", None, body, "text/plain"))
    assert status == 415, answer
    assert _silences(d) == [] and len(slack.messages) == sent_before
    # The controls: the same request under this daemon's own names (what curl and the CLI send) is taken.
    for host, origin in ((f"127.0.0.1:{port}", None), (f"localhost:{port}", f"http://localhost:{port}"),
                         (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}")):
        status, answer = _raw(d, _request("POST", "/api/v1/silences", host, origin, body))
        assert status == 200, (host, origin, answer)
        sid = json.loads(answer)["silenceID"]
        status, answer = _raw(d, _request("DELETE", f"/api/v1/silences/{sid}", host, origin))
        assert status == 200, answer
    assert _silences(d) == []


def test_receiver_tests_count_against_the_rate_limit(setup: tuple[DaemonProcess, Slack]) -> None:
    """200 test requests to a receiver limited to 6 a minute deliver a burst's worth, not 200."""
    d, slack = setup
    port = urllib.parse.urlsplit(d.url).port
    start, sent_before = time.monotonic(), len(slack.messages)
    answers: list[int] = []
    lock = threading.Lock()

    def hammer(n: int) -> None:
        for _ in range(n):
            status, _ = _raw(d, _request("POST", "/api/v1/receivers/test", f"127.0.0.1:{port}", None))
            with lock:
                answers.append(status)

    threads = [threading.Thread(target=hammer, args=(25,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    sent = len(slack.messages) - sent_before
    # The bucket: a burst of min(5, rate), then RATE a minute (plus one for a token refilled at the edge).
    allowed = min(5, RATE) + math.ceil(elapsed / 60 * RATE) + 1
    assert 1 <= sent <= allowed, (sent, allowed, elapsed)
    assert len(answers) == 200 and answers.count(200) == sent and answers.count(429) == 200 - sent, answers
    # The CLI says either in one line, never with a traceback.
    r = subprocess.run([sys.executable, "-m", "gpuwatchd", "notify", "test", "--url", d.url],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    out = r.stdout + r.stderr
    assert "Traceback" not in out and ("rate_limit_per_minute" in out or r.returncode == 0), out
