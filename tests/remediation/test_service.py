"""Remediation in the daemon's place, with scontrol absent, in dry-run mode, and across a restart (the ledger).
The real Slurm is in tests/integration/test_remediation_slurm.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.config.types import validate
from gpuwatchd.model import HealthChange
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.remediation.config import RemediationConfig
from gpuwatchd.remediation.service import Remediation
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.store import Store

U0 = "GPU-00000000-0000-4000-8000-000000000000"
LOST = GpuHealth("unhealthy", "GPU 0 lost (fell off the bus)", "reboot", 0.0, ("GpuLost",))
HEALTHY = GpuHealth("healthy", "ok", "none", 0.0)


def cfg(**slurm: Any) -> RemediationConfig:
    return validate(RemediationConfig, {"slurm": {"enabled": True, "node_name": "n1", "resume_after": "10s",
                                                  "min_interval": "30s", **slurm}})


def metrics(r: Remediation) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(r.collector())
    return generate_latest(reg).decode()


def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for scontrol that logs its calls and shows the node as the file ``node`` says (State|Reason)."""
    calls, node = tmp_path / "calls", tmp_path / "node"
    node.write_text("IDLE|")
    script = tmp_path / "scontrol"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = show ]; then
  IFS='|' read -r state reason < {node}
  echo "NodeName=$3 Arch=x86_64"
  echo "   State=$state ThreadsPerCore=1"
  [ -n "$reason" ] && echo "   Reason=$reason [root@2026-11-28T10:00:00]"
fi
exit 0
""")
    script.chmod(0o755)
    return script, calls


async def step(r: Remediation, store: Store, health: GpuHealth) -> None:
    store.ingest(HealthChange({U0: health}))
    await r.tick()


async def test_slurm_absent_is_one_log_line_and_a_metric_never_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock, store = ManualClock(), Store()
    r = Remediation(cfg(scontrol=str(tmp_path / "bin" / "scontrol")), store, clock, tmp_path, host="h1")
    caplog.set_level(logging.INFO)
    for _ in range(5):
        await step(r, store, LOST)
        clock.advance(31.0)
    lines = [rec for rec in caplog.records if "Slurm is not usable here" in rec.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    text = metrics(r)
    assert 'gpuwatchd_remediation_up{system="slurm"} 0.0' in text
    assert 'gpuwatchd_remediation_errors_total{reason="missing",system="slurm"} 5.0' in text
    assert 'gpuwatchd_remediation_actions_total{action="drain",result="failed",system="slurm"} 5.0' in text
    failed = [a for a in r.alerts() if a.name == "GpuwatchdRemediationFailed"]
    assert failed and "not found" in failed[0].description and r.ledger.drain is None


async def test_rate_limit_holds_retries(tmp_path: Path) -> None:
    clock, store = ManualClock(), Store()
    r = Remediation(cfg(scontrol=str(tmp_path / "none")), store, clock, tmp_path, host="h1")
    for _ in range(10):
        await step(r, store, LOST)
        clock.advance(1.0)
    assert 'action="drain",result="failed",system="slurm"} 1.0' in metrics(r)


async def test_dry_run_logs_counts_and_notifies_without_updating(tmp_path: Path) -> None:
    script, calls = fake_scontrol(tmp_path)
    clock, store = ManualClock(), Store()
    r = Remediation(cfg(scontrol=str(script), dry_run=True, min_interval="0s"), store, clock, tmp_path, host="h1")
    await step(r, store, LOST)
    drained = [a for a in r.alerts() if a.name == "GpuwatchdNodeDrained"]
    assert drained and "would be drained" in drained[0].summary and "dry run" in drained[0].summary
    await step(r, store, HEALTHY)
    clock.advance(11.0)
    await step(r, store, HEALTHY)
    assert not calls.exists() or "update" not in calls.read_text()
    text = metrics(r)
    assert 'action="drain",result="dry_run",system="slurm"} 1.0' in text
    assert 'action="resume",result="dry_run",system="slurm"} 1.0' in text
    assert not [a for a in r.alerts() if a.name == "GpuwatchdNodeDrained"]


async def test_the_decision_survives_a_restart(tmp_path: Path) -> None:
    script, calls = fake_scontrol(tmp_path)
    clock, store = ManualClock(), Store()
    r = Remediation(cfg(scontrol=str(script), min_interval="0s"), store, clock, tmp_path, host="h1")
    await step(r, store, LOST)
    assert calls.read_text().splitlines()[-1].startswith("update nodename=n1 state=drain reason=gpuwatchd: GPU")
    held = r.ledger.drain
    assert held is not None
    (tmp_path / "node").write_text(f"IDLE+DRAIN|{held.reason}")
    saved = json.loads((tmp_path / "remediation.json").read_text())
    assert saved["drain"]["reason"] == held.reason

    # A new daemon (same state_dir) with the GPU still bad: it holds the drain, never drains twice ...
    calls.unlink()
    r2 = Remediation(cfg(scontrol=str(script), min_interval="0s"), store, clock, tmp_path, host="h1")
    await step(r2, store, LOST)
    assert not calls.exists()
    # ... and resumes it once the GPU is healthy for resume_after, since the node still has its reason.
    await step(r2, store, HEALTHY)
    clock.advance(11.0)
    await step(r2, store, HEALTHY)
    assert calls.read_text().splitlines()[-1] == "update nodename=n1 state=resume"
    assert r2.ledger.drain is None and json.loads((tmp_path / "remediation.json").read_text())["drain"] is None


async def test_nothing_acts_unless_configured(tmp_path: Path) -> None:
    clock, store = ManualClock(), Store()
    r = Remediation(RemediationConfig(), store, clock, tmp_path, host="h1")
    await step(r, store, LOST)
    assert r.slurm is None and not r.alerts()
    assert not [line for line in metrics(r).splitlines() if line.startswith("gpuwatchd_remediation_actions_total")]


def test_config_refuses_bad_keys() -> None:
    from gpuwatchd.config.loader import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as e:
        config_from_dict({"remediation": {"slurm": {"drain_actions": ["explode"], "node_name": "a b"}}})
    text = str(e.value)
    assert "remediation.slurm.drain_actions" in text and "remediation.slurm.node_name" in text
    assert config_from_dict({}).remediation.slurm.enabled is False


async def test_resume_after_counts_from_when_the_drained_gpus_are_healthy(tmp_path: Path) -> None:
    script, calls = fake_scontrol(tmp_path)
    clock, store = ManualClock(), Store()
    r = Remediation(cfg(scontrol=str(script), min_interval="0s"), store, clock, tmp_path, host="h1")
    await step(r, store, LOST)
    held = r.ledger.drain
    assert held is not None
    (tmp_path / "node").write_text(f"IDLE+DRAIN|{held.reason}")
    # Gone from the bus for a long while (unknown): not a recovery, however long it lasts.
    for _ in range(5):
        clock.advance(30.0)
        await step(r, store, GpuHealth("unknown", "removed", "none", 0.0))
    clock.advance(1.0)
    await step(r, store, HEALTHY)
    assert "state=resume" not in calls.read_text()
    clock.advance(11.0)
    await step(r, store, HEALTHY)
    assert calls.read_text().splitlines()[-1] == "update nodename=n1 state=resume"


async def test_a_dry_run_drain_is_not_held_once_drains_are_real(tmp_path: Path) -> None:
    script, calls = fake_scontrol(tmp_path)
    clock, store = ManualClock(), Store()
    dry = Remediation(cfg(scontrol=str(script), dry_run=True), store, clock, tmp_path, host="h1")
    await step(dry, store, LOST)
    assert dry.ledger.drain is not None and dry.ledger.drain.dry_run
    real = Remediation(cfg(scontrol=str(script), min_interval="0s"), store, clock, tmp_path, host="h1")
    assert real.ledger.drain is None
    await step(real, store, LOST)
    assert "state=drain" in calls.read_text() and real.ledger.drain is not None and not real.ledger.drain.dry_run
