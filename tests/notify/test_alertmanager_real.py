"""A real Alertmanager (Debian ``prometheus-alertmanager``) on loopback receives our alerts through API v2 and
forwards them, fired and then resolved, to a local webhook sink."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from gpuwatchd.runtime.clock import RealClock, ScaledClock

from .conftest import HOST, UUID0, Sink, make_dispatcher, mk_alert, notify_config, receiver, resolved

AM = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def alertmanager(sink: Sink, tmp_path: Path) -> AsyncIterator[str]:
    if not Path(AM).exists():
        pytest.skip("prometheus-alertmanager is not installed (Debian package prometheus-alertmanager)")
    port = free_port()
    cfg = tmp_path / "am.yml"
    cfg.write_text(
        "route:\n  receiver: sink\n  group_by: [alertname, uuid]\n  group_wait: 0s\n  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        f"receivers:\n  - name: sink\n    webhook_configs:\n      - url: '{sink.url}'\n        send_resolved: true\n"
    )
    (tmp_path / "am-data").mkdir()
    proc = subprocess.Popen(
        [
            AM,
            f"--config.file={cfg}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                try:
                    async with http.get(f"{base}/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if proc.poll() is not None:
                    pytest.fail(f"alertmanager exited: {proc.stderr.read().decode() if proc.stderr else ''}")
                await asyncio.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


async def test_real_alertmanager_forwards_fired_and_resolved(sink: Sink, alertmanager: str, tmp_path: Path) -> None:
    clock = RealClock()
    config = notify_config(
        [receiver("fleet-am", "alertmanager", alertmanager)], alertmanager_resend="1s", external_url="http://h:9945"
    )
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        a = mk_alert("GpuLost", severity="critical", t=clock.now() - 5, summary="GPU 0 answers GPU_IS_LOST")
        d.update([a])
        [fired] = await sink.wait_for(1)
        body = fired.json
        assert body["status"] == "firing" and body["receiver"] == "sink"
        [alert] = body["alerts"]
        assert alert["labels"] == a.labels
        assert alert["annotations"]["summary"] == "GPU 0 answers GPU_IS_LOST"
        assert alert["generatorURL"] == "http://h:9945/api/v1/alerts"
        assert alert["fingerprint"] == a.fingerprint  # same algorithm as Alertmanager's label fingerprint

        d.update([resolved(a, clock.now())])
        while True:
            await sink.wait_for(len(sink.requests) + 1)
            if sink.requests[-1].json["status"] == "resolved":
                break
        last = sink.requests[-1].json["alerts"][0]
        assert last["status"] == "resolved" and last["labels"]["uuid"] == UUID0 and last["labels"]["host"] == HOST
    finally:
        await d.stop()


async def test_a_sim_clock_ahead_of_the_wall_resolves_in_alertmanager_at_once(
    sink: Sink, alertmanager: str, tmp_path: Path
) -> None:
    # `gpuwatchd sim --speed 60` an hour into its scenario: the daemon's clock is hours ahead of Alertmanager's.
    # Alertmanager keeps an alert active until its endsAt; stamped on the sim clock, a resolution stayed "active"
    # there for hours of real time. Mapped onto the wall clock, it is forwarded as resolved at once.
    clock = ScaledClock(start=time.time() + 3 * 3600, speed=60)
    config = notify_config([receiver("fleet-am", "alertmanager", alertmanager)], alertmanager_resend="60s")
    d = await make_dispatcher(config, tmp_path / "state", clock)
    try:
        a = mk_alert("GpuLost", severity="critical", t=clock.now() - 300, summary="GPU 0 answers GPU_IS_LOST")
        d.update([a])
        [fired] = await sink.wait_for(1)
        starts = fired.json["alerts"][0]["startsAt"]
        # 300 s of sim time before now is 5 s of real time before now: within a minute of the wall, not hours ahead
        assert abs(parse_rfc3339(starts) - time.time()) < 60, starts
        d.update([resolved(a, clock.now())])
        while True:
            await sink.wait_for(len(sink.requests) + 1)
            if sink.requests[-1].json["status"] == "resolved":
                break
        ends = sink.requests[-1].json["alerts"][0]["endsAt"]
        assert abs(parse_rfc3339(ends) - time.time()) < 60, ends
    finally:
        await d.stop()


def parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
