"""deploy/gpuwatchd/fleet.yml: the daemon config of a fleet host passes `gpuwatchd check-config` and posts to every
Alertmanager member the kit's Prometheus config names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpuwatchd.config.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "gpuwatchd" / "fleet.yml"


def test_check_config_accepts_it() -> None:
    r = subprocess.run([sys.executable, "-m", "gpuwatchd", "check-config", str(FLEET)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alertmanager_member_is_a_member_of_one_receiver() -> None:
    config = load_config(FLEET, required=True)
    [rc] = config.notify.receivers
    assert rc.type == "alertmanager"
    members = [m.url.get_secret_value().removeprefix("http://") for m in rc.members]
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert members == prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert len({m.key for m in rc.members}) == len(members) == 2
