"""deploy/alertmanager/alertmanager.yml: valid for `amtool check-config`, routes as amtool says, and its grouping,
timings and inhibit rules the daemon's own defaults (so moving notifications from the daemon to Alertmanager changes
nothing a user sees)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatchd.config.types import parse_duration
from gpuwatchd.notify.config import NotifyConfig
from gpuwatchd.notify.matchers import parse_matcher

ROOT = Path(__file__).resolve().parents[2]
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("amtool")
    if exe is None:
        pytest.skip("amtool not installed (Debian package 'prometheus-alertmanager'; .ci/run installs it)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False)


def load() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(AM_CONFIG.read_text())
    return data


def test_amtool_check_config() -> None:
    r = amtool("check-config", str(AM_CONFIG))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 inhibit rules" in r.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [(["alertname=GpuLost", "severity=critical"], "chat"), (["alertname=GpuThrottled", "severity=warning"], "chat")],
)
def test_amtool_routes(labels: list[str], receiver: str) -> None:
    r = amtool("config", "routes", "test", f"--config.file={AM_CONFIG}", *labels)
    assert r.returncode == 0 and r.stdout.strip() == receiver, r.stdout + r.stderr


def test_route_mirrors_the_daemon_defaults() -> None:
    daemon = NotifyConfig()
    route = load()["route"]
    assert tuple(route["group_by"]) == daemon.group_by
    assert parse_duration(route["group_wait"]) == daemon.group_wait
    assert parse_duration(route["group_interval"]) == daemon.group_interval
    assert parse_duration(route["repeat_interval"]) == daemon.repeat_interval
    subroutes = [(tuple(parse_matcher(m) for m in r["matchers"]), parse_duration(r["group_wait"]),
                  parse_duration(r["group_interval"]) if "group_interval" in r else None)
                 for r in route["routes"]]
    assert subroutes == [(r.matchers, r.group_wait, r.group_interval) for r in daemon.routes]


def test_inhibit_rules_mirror_the_daemon_defaults() -> None:
    am = [
        (tuple(parse_matcher(m) for m in r["source_matchers"]), tuple(parse_matcher(m) for m in r["target_matchers"]),
         tuple(r["equal"]))
        for r in load()["inhibit_rules"]
    ]
    daemon = [(r.source_matchers, r.target_matchers, r.equal) for r in NotifyConfig().inhibit_rules]
    assert am[: len(daemon)] == daemon
    # the one addition: the fleet rules' host-level count drop, muted by the GPU-level loss
    [(source, target, equal)] = am[len(daemon):]
    assert source[0].matches({"alertname": "GpuLost"}) and source[0].matches({"alertname": "GpuRemoved"})
    assert [m.matches({"alertname": "GpuCountDropped"}) for m in target] == [True]
    assert equal == ("host",)
