"""The real daemon against the stand-in driver, playing a scenario, with every chat service played by a local sink.

scenario player -> stand-in libnvidia-ml -> real pynvml in the NVML worker -> store -> rules engine -> dispatcher
-> real HTTP to one sink per service. Only the GPU is fake. Time is a ScaledClock shared by player and daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuwatchd.config.loader import Config, config_from_dict
from gpuwatchd.notify.format import UUID_SHORT
from gpuwatchd.runtime.clock import ScaledClock
from gpuwatchd.sim.player import Player
from gpuwatchd.sim.scenario import load_scenario
from gpuwatchd.sim.standin_abi import STATE_ENV
from gpuwatchd.sim.worker import WORKER_MODULE as SIM_WORKER_MODULE

from .conftest import Sink, start_sink

# Wall seconds the daemon may take to get its first NVML result (a loaded 2-core machine starts Python slowly).
READY_WALL_S = 120.0
SERVICES = ("slack", "discord", "teams", "mattermost", "webhook")
# Rules a scenario needs that are off by default (the scenario's description says so), by scenario name.
SCENARIO_RULES: dict[str, dict[str, Any]] = {"underutilized": {"underutilized": {"enabled": True}}}


@dataclass(frozen=True)
class Seen:
    """One state change of one alert as the rules engine reported it, and whether the dispatcher muted it."""

    t: float
    fingerprint: str
    name: str
    state: str
    muted: bool


@dataclass
class ScenarioRun:
    sinks: dict[str, Sink]
    seen: list[Seen]
    end: float  # scenario time at the end of the run


def sim_config(sinks: dict[str, Sink], state_dir: Path, libdir: Path, sysfs_root: Path | None = None,
               rules: dict[str, Any] | None = None) -> Config:
    """Every chat service's receiver on its sink; an ``alertmanager`` sink in ``sinks`` adds that receiver too."""
    receivers = [
        {"name": f"{s}-1", "type": s, "url": sinks[s].url, "rate_limit_per_minute": 6000, "timeout": "5s"}
        for s in (*SERVICES, "alertmanager") if s in sinks
    ]
    return config_from_dict(
        {
            "host": "sim-host",
            "listen": "127.0.0.1:0",
            "state_dir": str(state_dir),
            "nvml": {"library_path": str(libdir)},
            # The fake PCI tree the player keeps in step (as `gpuwatchd sim` does): hot-plug reaches the daemon
            # through its sysfs watch, the way a dock detach does on a real host. Without it only the worker's own
            # re-enumeration after a loss could notice a removal, at whatever moment its respawn happened to land.
            **({"sysfs": {"root": str(sysfs_root)}} if sysfs_root is not None else {}),
            **({"rules": rules} if rules else {}),
            "notify": {
                "receivers": receivers,
                # Every alert to every service; group_wait short so a message is never held past the run's end.
                "routes": [{"receiver": r["name"], "continue": True} for r in receivers],
                "group_wait": "5s",
                "group_interval": "30s",
                "repeat_interval": "4h",
                "retry_initial": "1s",
            },
        }
    )


async def play(name: str, tmp: Path, *, speed: float, tail: float, rules: dict[str, Any] | None = None) -> ScenarioRun:
    """Run scenario ``name`` to its end plus ``tail`` scenario seconds; returns what each sink received."""
    from gpuwatchd.daemon import Daemon
    from gpuwatchd.sim.build import build_standin

    scen = load_scenario(name)
    runners: list[web.AppRunner] = []
    sinks: dict[str, Sink] = {}
    for s in SERVICES:
        sink, runner = await start_sink(f"/{s}/SECRET{s}")
        sinks[s] = sink
        runners.append(runner)
    clock = ScaledClock(speed=speed)
    state_path = tmp / "state"
    player = Player(scen, state_path, clock, sysfs_root=tmp / "sysfs")
    player.write_initial()
    config = sim_config(sinks, tmp / "state-dir", build_standin(), tmp / "sysfs",
                        SCENARIO_RULES.get(name) if rules is None else rules)
    daemon = Daemon(config, clock=clock, worker_env={**os.environ, STATE_ENV: str(state_path)},
                    worker_module=SIM_WORKER_MODULE)
    seen: list[Seen] = []
    await daemon.start()
    # The scenario starts once the worker has answered: on a loaded machine its start-up takes seconds of wall
    # time, hundreds of scenario seconds at these speeds, and the events of that stretch would never be seen.
    deadline = time.monotonic() + READY_WALL_S
    while not daemon.ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"the daemon had no NVML result {READY_WALL_S:g} wall seconds after start")
        await asyncio.sleep(0.05)
    player.start = clock.now()
    player.write_initial()
    task = asyncio.create_task(player.run())
    try:
        end = scen.duration + tail
        last: dict[str, tuple[str, bool]] = {}
        while player.scenario_time() < end:
            await asyncio.sleep(0.01)
            now = clock.now()
            for a in daemon.alerts:
                state = (a.state, daemon.dispatcher.muting(a, now).muted)
                if last.get(a.fingerprint) != state:
                    last[a.fingerprint] = state
                    seen.append(Seen(player.scenario_time(), a.fingerprint, a.name, a.state, state[1]))
        finish = player.scenario_time()
        # Let queued notifications go out (the clock keeps running; nothing new is due this soon).
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await daemon.stop()
        for r in runners:
            await r.cleanup()
    return ScenarioRun(sinks, seen, finish)


def summary(body: Any, service: str) -> list[tuple[str, str]]:
    """(status, alertname) per alert of one message, read back from each service's own format."""
    if service == "webhook":
        return [(a["status"], a["labels"]["alertname"]) for a in body["alerts"]]
    if service == "discord":
        return [
            ("resolved" if e["title"].startswith("RESOLVED") else "firing", e["title"].split(": ", 1)[1])
            for e in body["embeds"]
        ]
    text = {
        "slack": lambda b: b["text"],
        "mattermost": lambda b: b["text"],
        "teams": lambda b: b["attachments"][0]["content"]["body"][1]["text"],
    }[service](body)
    out = []
    for line in text.splitlines():
        for word, status in (
            ("RESOLVED", "resolved"),
            ("CRITICAL", "firing"),
            ("WARNING", "firing"),
            ("INFO", "firing"),
        ):
            marker = {"slack": f"*{word}* ", "mattermost": f"**{word}** ", "teams": f"**{word}** "}[service]
            if line.startswith(marker):
                out.append((status, line[len(marker) :].split(":")[0]))
    return out


def message_text(body: Any, service: str) -> str:
    """Everything a reader sees in one chat message."""
    if service == "discord":
        return "\n".join([body["content"]] + [f"{e['title']}\n{e['description']}" for e in body["embeds"]])
    if service == "teams":
        return "\n".join(b["text"] for b in body["attachments"][0]["content"]["body"])
    if service == "slack":  # mrkdwn entities (notify/slack.escape) as the reader sees them
        return str(body["text"]).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return str(body["text"])


def check_chat_text(sinks: dict[str, Sink]) -> None:
    """Each chat message names the host, each alert's GPU (index, model, short uuid) and its summary."""
    hooks = sinks["webhook"].bodies()
    for service in ("slack", "discord", "teams", "mattermost"):
        for hook, body in zip(hooks, sinks[service].bodies(), strict=True):
            text = message_text(body, service)
            assert "on sim-host" in text, service
            for a in hook["alerts"]:
                lab = a["labels"]
                if "uuid" in lab:
                    assert f"GPU {lab['gpu']} · {lab['model']} · {lab['uuid'][:UUID_SHORT]}" in text, service
                else:  # a Thunderbolt dock's alert names the dock and silences by its unique_id
                    assert f" — {lab['dock']}" in text, service
                    assert a["status"] == "resolved" or f'unique_id="{lab["unique_id"]}"' in text, service
                assert a["annotations"]["summary"][:40] in text, service
                if "sparkline" in a["annotations"]:  # the leak rule draws the memory trend
                    assert f"Trend: {a['annotations']['sparkline']}" in text, service


def check_unplug(hooks: list[Any], *, exact: bool = True) -> None:
    """egpu-unplug as a user sees it: one incident, one firing GpuRemoved naming the detached dock and saying to
    re-plug it (no GpuLost, no "reboot"), then one resolution saying the GPU is back, now at index 1.

    ``exact=False`` (the 30x run): those two come first; what follows them is timing at that speed (the kernel's
    "NVRM: GPU at" line for the re-plugged GPU can be read after the first snapshot that shows it back, 1/30 of the
    moment it has at 1x), and tests/integration/test_sim_incidents.py counts the messages at 1x."""
    events = [
        (a["status"], a["labels"]["alertname"], a["annotations"]["summary"], a["annotations"].get("action", ""))
        for h in hooks
        for a in h["alerts"]
        if a["labels"]["alertname"] in ("GpuLost", "GpuRemoved")
    ]
    order = [(status, alert) for status, alert, _, _ in events]
    if not exact:
        events, order = events[:2], order[:2]
    assert order == [("firing", "GpuRemoved"), ("resolved", "GpuRemoved")], order
    fired, back = events
    assert "Razer Core X Chroma" in fired[2] and "was detached" in fired[2], fired
    assert "Re-plug the dock" in fired[3] and "reboot" not in fired[3].replace("no reboot", ""), fired
    if not exact:
        return
    assert "now at index 1" in back[2] and "GPU-3a1e07c5-9c0f-4b7e-8d1a-e6b3090e6b30" in back[2], back
