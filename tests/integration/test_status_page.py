"""The status page at ``/`` in a real headless Chromium (Debian's ``chromium``, driven by Playwright) against real
sims: it loads without a console error under its strict CSP, and shows each scenario's key fact (the leaking pid
and its time to full, the unauthorized dock and its ``boltctl`` command, the lost eGPU). Screenshots are saved for
a person to look at: in ``$GPUWATCHD_SCREENSHOT_DIR`` when set, else in pytest's temporary directory (printed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from support import ROOT, START_SECONDS, DaemonProcess, free_port, wait_until
from test_status_watch import silence

CHROMIUM = os.environ.get("GPUWATCHD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PHONE = {"width": 375, "height": 667}  # the narrowest phone screen in wide use (iPhone SE)
DESKTOP = {"width": 1280, "height": 900}
USER, PASSWORD = "ops", "s3cret"
# A sim starting on a loaded 2-core machine (CI beside other jobs): a liveness bound, each wait ends once it serves.
SIM_START = 180.0
pytestmark = pytest.mark.timeout(600)  # each test starts sims and a browser page: beyond the suite's 120 s when loaded

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
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("GPUWATCHD_SCREENSHOT_DIR")
    out = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    print(f"status page screenshots in {out}")
    return out


def _start(tmp: Path, *args: str, port: int | None = None) -> DaemonProcess:
    port = port or free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    log_path = tmp / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatchd", "sim", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    return DaemonProcess(proc, f"http://127.0.0.1:{port}", tmp / "unused.yml", log_path)


def serving(d: DaemonProcess) -> bool:
    assert d.proc.poll() is None, f"sim exited with {d.proc.returncode}:\n{d.log()}"
    try:
        return d.get("/readyz", timeout=1)[0] == 200
    except OSError:
        return False


class ChatService(BaseHTTPRequestHandler):
    """A chat service on loopback: ``/ok`` takes every message, ``/refuse`` answers 400 (a permanent failure)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ok = self.path == "/ok"
        body = b"ok" if ok else b"invalid_payload: no such channel"
        self.send_response(200 if ok else 400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def chat() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def leak_config(tmp: Path, chat: str) -> Path:
    """Two receivers for every alert: one that takes them, one that refuses them."""
    cfg = tmp / "gpuwatchd.yml"
    cfg.write_text(yaml.safe_dump({"notify": {
        "receivers": [{"name": "team-chat", "type": "webhook", "url": f"{chat}/ok"},
                      {"name": "old-hook", "type": "webhook", "url": f"{chat}/refuse"}],
        "routes": [{"receiver": "team-chat", "continue": True}, {"receiver": "old-hook"}],
    }}))  # fmt: skip
    return cfg


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory, chat: str) -> Iterator[dict[str, DaemonProcess]]:
    """The scenarios, started together (they overlap their warm-up)."""
    leak_tmp = tmp_path_factory.mktemp("leak")
    running = {
        "leak": _start(leak_tmp, "--scenario", "leak", "--speed", "30", "--config",
                       str(leak_config(leak_tmp, chat))),
        "dock-unauthorized": _start(tmp_path_factory.mktemp("dock"), "--scenario", "dock-unauthorized"),
        # no kubelet here: owners come from each process' cgroup (container ids, the Slurm job)
        "attribution": _start(tmp_path_factory.mktemp("attribution"), "--scenario", "attribution"),
    }

    try:
        for d in running.values():
            wait_until(lambda d=d: serving(d), "gpuwatchd sim to serve", START_SECONDS)
        yield running
    finally:
        _stop(*running.values())


def _stop(*daemons: DaemonProcess) -> None:
    for d in daemons:
        d.proc.terminate()
    for d in daemons:
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


def status(d: DaemonProcess) -> dict[str, Any]:
    code, body = d.get("/api/v1/status")
    assert code == 200, body
    out: dict[str, Any] = json.loads(body)
    return out


class PageLog:
    """Console messages, page errors and failed requests of one page load."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} {r.failure}"))


def open_page(browser: Any, url: str, viewport: dict[str, int], **context: Any) -> tuple[Any, Any, PageLog]:
    ctx = browser.new_context(viewport=viewport, **context)
    page = ctx.new_page()
    log = PageLog(page)
    resp = page.goto(url + "/")
    assert resp is not None and resp.status == 200
    page.wait_for_selector("#conn:has-text('live')")
    return ctx, page, log


def check_csp(d: DaemonProcess) -> None:
    import urllib.request

    with urllib.request.urlopen(d.url + "/", timeout=5) as r:
        csp = r.headers["Content-Security-Policy"]
    directives = dict(x.strip().split(" ", 1) for x in csp.split(";"))
    assert directives["script-src"] == "'self'" and directives["default-src"] == "'none'"
    assert "unsafe" not in csp and "*" not in csp and "data:" not in csp and "http" not in csp


# What the page's charts hold when none was drawn: whether uPlot loaded, and each chart box (hidden: fewer than two
# history points, or no uPlot).
CHARTS_HELD = """() => ({uPlot: typeof uPlot, charts: [...document.querySelectorAll('.chart')].map((e) => ({
    hidden: e.hidden, width: e.clientWidth, height: e.clientHeight, html: e.innerHTML.slice(0, 120)}))})"""


def test_leak_shows_the_leaking_pid_and_its_eta(browser: Any, sims: dict[str, DaemonProcess], shots: Path) -> None:
    d = sims["leak"]
    check_csp(d)

    def leak_seen() -> bool:
        procs = [p for g in status(d)["gpus"] for p in g["processes"]]
        return any(p["pid"] == 4242 and (p.get("memory_trend") or {}).get("leak") for p in procs)

    wait_until(leak_seen, "the leak rule to suspect pid 4242", timeout=120)
    # What shows the leak is checked on both pages first, while it lasts (the scenario's leak ends ~75 s of wall
    # time after it is seen at --speed 30); the deliveries, which stay listed, are waited for after.
    pages = []
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        ctx, page, log = open_page(browser, d.url, viewport)
        pages.append((name, viewport, ctx, page, log))
        row = page.locator("tr[data-pid='4242']")
        # The page refreshes itself every few seconds: the first answer it drew may predate the verdict seen above.
        page.wait_for_selector("tr[data-pid='4242'] td.eta:has-text('full in')")
        text = row.inner_text()
        assert "python" in text and (name == "phone" or "alice" in text)  # the user column: not on a phone
        assert "/min" in text  # the trend column
        try:
            page.wait_for_selector(".chart canvas")  # uPlot drew the memory history
        except Exception as e:  # seen once in five CI-like runs, not reproduced since: say what the page held
            held = page.evaluate(CHARTS_HELD)
            raise AssertionError(f"no memory chart drawn: {held}; page errors {log.errors}") from e
        # Said above the table as well, where a phone shows it without scrolling sideways.
        note = page.locator(".leak-note[data-pid='4242']")
        assert "python[4242] (alice)" in note.inner_text() and "full in" in note.inner_text()
        # The page redraws the processes at every refresh: a read that met the old note as it was replaced gives
        # nothing, so it is read again (the note itself is there: its text was read above).
        box = wait_until(note.bounding_box, "the leak note's box", timeout=SIM_START)
        assert box is not None and box["x"] + box["width"] <= viewport["width"]
    for *_, page, _log in pages:
        # Deliveries per receiver: the leak's message reached the chat service; the other receiver refused it.
        page.wait_for_selector(".receiver[data-receiver='team-chat'] li.delivered", timeout=90_000)
        page.wait_for_selector(".receiver[data-receiver='old-hook'] li.failed", timeout=90_000)
        refused = page.locator(".receiver[data-receiver='old-hook']").inner_text()
        assert "HTTP 400" in refused and "invalid_payload: no such channel" in refused
    # A silence (once the message went out): the firing alert is shown as silenced.
    silence(d.url, "GpuMemoryLeak")
    pages[0][3].wait_for_selector(".alert.silenced[data-alertname='GpuMemoryLeak'] .badge:has-text('silenced')")
    for name, viewport, ctx, page, log in pages:
        if name == "phone":  # fits: nothing wider than the screen but the scrollable tables
            assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        page.screenshot(path=str(shots / f"leak-{name}.png"), full_page=True)
        assert log.errors == []
        ctx.close()


def test_processes_name_their_container_or_job(browser: Any, sims: dict[str, DaemonProcess]) -> None:
    d = sims["attribution"]

    def owners_known() -> bool:
        procs = {p["pid"]: p for g in status(d)["gpus"] for p in g["processes"]}
        return all(pid in procs for pid in (4242, 7301, 7302)) and (procs[7301].get("owner") or {}).get("hpc_job")

    wait_until(owners_known, "the attribution of pids 4242, 7301 and 7302")
    ctx, page, log = open_page(browser, d.url, DESKTOP)
    owner = {pid: page.locator(f"tr[data-pid='{pid}'] td.owner") for pid in (4242, 7301, 7302)}
    owner[7301].wait_for()
    assert owner[7301].inner_text() == "job 4242"  # the Slurm job step
    assert owner[4242].inner_text().startswith("container 8d1e4b2a9f3c")  # a pod's container, no kubelet to name it
    assert owner[7302].inner_text() == "host"
    assert page.locator("table.procs th", has_text="Owner").count() >= 1
    assert log.errors == []
    ctx.close()


def test_dock_unauthorized_shows_the_dock_and_boltctl(browser: Any, sims: dict[str, DaemonProcess],
                                                      shots: Path) -> None:
    d = sims["dock-unauthorized"]
    wait_until(lambda: status(d)["docks"], "the dock in /api/v1/status")
    uid = status(d)["docks"][0]["unique_id"]
    ctx, page, log = open_page(browser, d.url, PHONE)
    dock = page.locator(f".dock[data-unique-id='{uid}']")
    dock.wait_for()
    assert "NOT authorized" in dock.inner_text()
    # The advice its GpuDockUnauthorized carries (rules/advice.py): the level is 'user', so enroll it.
    assert f"boltctl enroll {uid}" in dock.locator(".action").inner_text()
    assert "BIOS" not in dock.locator(".action").inner_text()
    page.screenshot(path=str(shots / "dock-unauthorized-phone.png"), full_page=True)
    assert log.errors == []
    ctx.close()


def test_egpu_unplug_shows_the_lost_gpu(browser: Any, tmp_path: Path, shots: Path) -> None:
    # Its own sim, started here: the eGPU is gone only from 58 s to 120 s of the scenario (14.5 to 30 s of wall time
    # at 4x), and started with the other scenarios that window had passed whenever the tests before this one took
    # longer than that (a loaded machine: the leak test's page checks).
    d = _start(tmp_path / "unplug", "--scenario", "egpu-unplug", "--speed", "4")
    try:
        wait_until(lambda: serving(d), "gpuwatchd sim to serve", START_SECONDS)
        _egpu_unplug_shows_the_lost_gpu(browser, d, shots)
    finally:
        _stop(d)


def _egpu_unplug_shows_the_lost_gpu(browser: Any, d: DaemonProcess, shots: Path) -> None:
    # The eGPU (index 0) falls off the bus 58 s into the scenario (15 s at 4x), then is removed.
    wait_until(lambda: any(g["state"] != "present" for g in status(d)["gpus"]), "the eGPU gone", timeout=100)
    gone = next(g for g in status(d)["gpus"] if g["state"] != "present")
    ctx, page, log = open_page(browser, d.url, DESKTOP)
    card = page.locator(f"article.gpu[data-uuid='{gone['uuid']}']")
    card.wait_for()
    # A selector wait, not wait_for_function: a string predicate is evaluated with eval(), which the page's CSP
    # (script-src 'self') refuses as soon as Playwright has to poll it (the card not redrawn yet, a loaded machine).
    page.locator(f"article.gpu[data-uuid='{gone['uuid']}']:not(.state-present)").wait_for()
    text = card.inner_text()
    assert "Core X Chroma" in text  # the dock it was in
    assert "Not answering since" in text
    assert card.locator(".badge").first.inner_text().lower() in ("lost", "removed")
    page.wait_for_selector("#xids li[data-xid='79']")
    assert "fallen off the bus" in page.locator("#xids li[data-xid='79']").inner_text().lower()
    page.screenshot(path=str(shots / "egpu-unplug-desktop.png"), full_page=True)
    assert log.errors == []
    ctx.close()


def test_page_keeps_going_when_the_daemon_goes_away(browser: Any, tmp_path: Path) -> None:
    """The page says the daemon is not answering (and keeps retrying) instead of freezing on old numbers, and is
    live again once a daemon answers at the same address (a restart)."""
    port = free_port()
    d = _start(tmp_path, "--scenario", "idle", port=port)
    again: DaemonProcess | None = None
    try:
        wait_until(lambda: serving(d), "gpuwatchd sim to serve", START_SECONDS)
        ctx, page, log = open_page(browser, d.url, DESKTOP)
        d.proc.terminate()
        d.proc.wait(timeout=30)
        page.wait_for_selector("#conn.down", timeout=30_000)
        assert "not answering" in page.locator("#conn").inner_text()
        again = _start(tmp_path / "again", "--scenario", "dock-unauthorized", port=port)
        wait_until(lambda: serving(again), "the second sim to serve", START_SECONDS)
        # Retries back off to 30 s at most: within a minute the page shows the new daemon's dock.
        page.wait_for_selector(".dock .action:has-text('boltctl enroll')", timeout=60_000)
        assert page.locator("#conn").inner_text().startswith("live")
        ctx.close()
        # Failed fetches while it was down are what the page reports itself; no script error.
        assert [e for e in log.errors if "request failed" not in e and "Failed to load resource" not in e] == []
    finally:
        for p in (d, again):
            if p is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()


def test_page_behind_tls_and_basic_auth(browser: Any, tmp_path: Path, tls_files: Any) -> None:
    """The page and its assets are guarded like /metrics: 401 without the password; with it, the page works."""
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tls_files.cert), "key_file": str(tls_files.key)},
        "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()},
    }))  # fmt: skip
    d = _start(tmp_path, "--scenario", "idle", "--web.config.file", str(web))
    url = d.url.replace("http://", "https://")
    try:
        ctx = browser.new_context(ignore_https_errors=True)
        for path in ("/", "/static/app.js", "/api/v1/status"):
            def answered(path: str = path) -> int | None:
                assert d.proc.poll() is None, d.log()
                try:
                    return int(ctx.request.get(url + path).status)
                except Exception:  # not listening yet
                    return None
            assert wait_until(answered, f"{path} to answer", timeout=SIM_START) == 401
        ctx.close()
        ctx, page, log = open_page(browser, url, DESKTOP, ignore_https_errors=True,
                                   http_credentials={"username": USER, "password": PASSWORD})
        page.wait_for_selector("article.gpu")
        assert log.errors == []
        ctx.close()
    finally:
        d.proc.terminate()
        d.proc.wait(timeout=30)


HOSTILE_NAME = ('<img src=x onerror="document.title=\'pwned\'"></td><script>document.title="pwned"</script>'
                "\u202egnp.exe" + "W" * 300)
HOSTILE_USER = "bob\u202e<b>x</b>"


def test_hostile_names_render_as_text_under_the_csp(browser: Any, tmp_path: Path) -> None:
    """A process and user name holding markup, a script, a bidi override and 300 characters without a space (the
    leak scenario with those names): shown as text in the table, the leak note and the alert, no element made of
    them, no CSP violation, the override isolated from the sentence around it, nothing wider than a phone."""
    doc = yaml.safe_load((ROOT / "gpuwatchd/sim/scenarios/leak.yml").read_text())
    doc["name"] = "hostile-names"
    for step in doc["timeline"]:
        if "add_process" in step:
            step["add_process"].update(name=HOSTILE_NAME, user=HOSTILE_USER)
    scenario = tmp_path / "hostile-names.yml"
    scenario.write_text(yaml.safe_dump(doc, allow_unicode=True))
    d = _start(tmp_path / "sim", "--scenario", str(scenario), "--speed", "30")
    try:
        wait_until(lambda: serving(d), "gpuwatchd sim to serve", START_SECONDS)
        check_csp(d)

        def leak_seen() -> bool:
            procs = [p for g in status(d)["gpus"] for p in g["processes"]]
            return any((p.get("memory_trend") or {}).get("leak") for p in procs)

        wait_until(leak_seen, "the leak rule to suspect pid 4242", timeout=120)
        for viewport in (DESKTOP, PHONE):
            ctx, page, log = open_page(browser, d.url, viewport)
            row = page.locator("tr[data-pid='4242']")
            row.wait_for()
            assert row.locator("td").nth(1).text_content() == HOSTILE_NAME
            note = page.locator(".leak-note[data-pid='4242']")
            assert note.locator("strong").first.text_content() == HOSTILE_NAME + "[4242]"
            assert note.locator("bdi").last.text_content() == HOSTILE_USER
            for sel in ("strong", "bdi"):
                # Read again when the refresh replaced the element under the read (a detached element has no style).
                style = wait_until(lambda sel=sel, note=note: note.locator(sel).first.evaluate(
                    "e => e.isConnected ? getComputedStyle(e).unicodeBidi : ''"), f"the {sel}'s style", timeout=60)
                assert style == "isolate"
            assert page.locator("main img, main script, main b").count() == 0
            assert "pwned" not in page.title()
            if viewport is PHONE:
                assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
            assert log.errors == []
            ctx.close()
    finally:
        d.proc.terminate()
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


def test_dump_dom_after_several_refreshes_still_has_every_chart(tmp_path: Path) -> None:
    """The one-command check of the report (idle: 2 canvases after load, 0 after the first refresh): Chromium's
    virtual clock runs the page's 3 s refreshes for 15 s, and the DOM it dumps still has a chart per GPU card."""
    d = _start(tmp_path / "idle", "--scenario", "idle")
    try:
        wait_until(lambda: serving(d), "gpuwatchd sim to serve", timeout=SIM_START)
        wait_until(lambda: all(len(g["memory_history"]) >= 2 for g in status(d)["gpus"]), "two points per GPU",
                   timeout=120)
        args = [CHROMIUM, "--headless=new", *CHROMIUM_ARGS[1:], "--virtual-time-budget=15000", "--dump-dom"]
        dom = subprocess.run([*args, d.url + "/"], capture_output=True, text=True, timeout=300, check=True).stdout
        cards = dom.count('<article class="gpu')
        assert cards == 2 and dom.count("<canvas") == cards, dom[dom.find('<div id="gpus"'):][:2000]
        assert dom.count('data-projection="no"') == cards  # idle: no leak line
    finally:
        _stop(d)
