"""The status page's weight and what keeping it open costs the daemon.

    python bench/page.py [--gpus 8] [--procs 32] [--seconds 30] [--pids live|dead]

`gpuwatchd run` against the stand-in driver (8 GPUs x 32 processes, 1 s polls: the same host as
bench/footprint.py, its processes real ``sleep`` ones by default, ``--pids dead`` for fictitious pids) and Debian's
chromium (headless, driven by Playwright):

1. First load: every byte the browser received for ``GET /`` and what it pulled in (HTML, script, style, uPlot,
   favicon, and the first ``/api/v1/status`` and ``/api/v1/alerts``), headers included, with an empty cache
   (Chrome's ``encodedDataLength``). ``page_bytes`` is that total; ``asset_bytes`` the part that is the page itself
   (cached by the browser after the first load); ``poll_bytes`` what one refresh (status + alerts) costs after.
2. Daemon CPU (the daemon process alone, not its NVML worker) over ``--seconds`` without the page, then with one
   page open (it refreshes every 3 s), in percent of one core.

Last line: ``page_bytes=… asset_bytes=… poll_bytes=… daemon_cpu_pct_idle=… daemon_cpu_pct_page=… pids=…``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from footprint import Daemon, add_pids_option, fleet  # noqa: E402

from gpuwatchd.sim.build import build_standin  # noqa: E402
from gpuwatchd.sim.state import write_state  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def daemon_cpu(d: Daemon) -> float:
    t = d.ps.cpu_times()
    return float(t.user + t.system)


def measure_cpu(d: Daemon, seconds: float, wait: Any = time.sleep) -> float:
    c0, t0 = daemon_cpu(d), time.monotonic()
    wait(seconds)
    return 100.0 * (daemon_cpu(d) - c0) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30.0)
    add_pids_option(ap)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmpdir, fleet(args.gpus, args.procs, args.pids) as state:
        tmp = Path(tmpdir)
        state_path = tmp / "sim-state"
        write_state(state_path, state)
        d = Daemon(tmp, "page", state_path, {"nvml": {"library_path": str(build_standin())}})
        try:
            d.wait_for_gpus(args.gpus)
            time.sleep(3)  # past start-up work
            idle = measure_cpu(d, args.seconds)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                cdp = page.context.new_cdp_session(page)
                cdp.send("Network.enable")
                cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
                urls: dict[str, str] = {}
                sizes: list[tuple[str, float]] = []

                def sent(e: dict[str, Any]) -> None:
                    urls[e["requestId"]] = e["request"]["url"]

                def done(e: dict[str, Any]) -> None:
                    sizes.append((urls.get(e["requestId"], "?"), float(e["encodedDataLength"])))

                cdp.on("Network.requestWillBeSent", sent)
                cdp.on("Network.loadingFinished", done)
                page.goto(d.url + "/")
                page.wait_for_selector("#conn:has-text('live')")
                page.wait_for_timeout(500)
                first = list(sizes)
                page_bytes = sum(n for _, n in first)
                asset_bytes = sum(n for u, n in first if "/api/" not in u)
                cdp.send("Network.setCacheDisabled", {"cacheDisabled": False})
                sizes.clear()
                # Playwright's sync API handles the page's events only inside its own calls: wait in one.
                page_cpu = measure_cpu(d, args.seconds, lambda s: page.wait_for_timeout(s * 1000))
                polls = [n for u, n in sizes if "/api/v1/" in u]
                poll_bytes = 2 * sum(polls) / max(1, len(polls))  # one refresh = status + alerts
                for u, n in first:
                    print(f"  {n:9.0f}  {u.replace(d.url, '')}")
                browser.close()
        finally:
            d.stop()
    print(f"{args.gpus} GPUs x {args.procs} processes; {len(polls)} API requests in {args.seconds:g} s with the "
          "page open")
    print(f"page_bytes={page_bytes:.0f} asset_bytes={asset_bytes:.0f} poll_bytes={poll_bytes:.0f} "
          f"daemon_cpu_pct_idle={idle:.2f} daemon_cpu_pct_page={page_cpu:.2f} pids={args.pids}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
