"""Escalation: a failure back after the action it asked for (a reboot: the boot id changed; a GPU reset: the GPU
left and came back) says that action did not help and what comes next; an acknowledgement starts over."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatchd.config.types import SecretStr
from gpuwatchd.model import GpuSample, HealthChange, LostGpu, Snapshot
from gpuwatchd.model.health import GpuHealth
from gpuwatchd.notify.config import ApiConfig
from gpuwatchd.remediation import escalation
from gpuwatchd.remediation.api import health_routes
from gpuwatchd.remediation.config import RemediationConfig
from gpuwatchd.remediation.ledger import GpuRecord
from gpuwatchd.remediation.service import Remediation
from gpuwatchd.runtime.clock import ManualClock
from gpuwatchd.store import Store

U0 = "GPU-11111111-2222-3333-4444-555555555555"
TOKEN = "0123456789abcdef0123"
XID79 = GpuHealth("unhealthy", "Xid 79: fell off the bus", "reboot", 0.0, ("GpuXidError",))
DBE = GpuHealth("unhealthy", "Xid 48: double-bit ECC error", "reset_gpu", 0.0, ("GpuXidError",))
APP = GpuHealth("unhealthy", "Xid 13", "restart_app", 0.0, ("GpuXidError",))
HEALTHY = GpuHealth("healthy", "ok", "none", 0.0)


def test_a_reboot_that_did_not_help() -> None:
    rec = GpuRecord()
    assert not escalation.on_failure(rec, XID79, "boot-a", 0, 1.0)
    assert not escalation.on_failure(rec, XID79, "boot-a", 0, 2.0)  # no reboot in between: nothing to judge
    assert escalation.on_failure(rec, XID79, "boot-b", 0, 3.0)
    assert rec.escalation == 1 and rec.escalated_after == "reboot"
    assert escalation.summary("GPU 0", rec) == "GPU 0 failed again after a reboot: the reboot did not help"
    assert "inspect" in escalation.next_steps(1) and "replace the GPU" in escalation.next_steps(1)
    assert escalation.on_failure(rec, XID79, "boot-c", 0, 4.0)
    assert rec.escalation == 2 and escalation.next_steps(2).startswith("replace the GPU")
    assert len(rec.failures) == 4


def test_a_gpu_reset_that_did_not_help_and_actions_that_cannot_be_judged() -> None:
    rec = GpuRecord()
    escalation.on_failure(rec, DBE, "boot-a", 0, 1.0)
    assert not escalation.on_failure(rec, DBE, "boot-a", 0, 2.0)  # not reset yet
    assert escalation.on_failure(rec, DBE, "boot-a", 1, 3.0)  # reset (left and came back), failed again
    assert rec.escalated_after == "reset_gpu"
    app = GpuRecord()
    escalation.on_failure(app, APP, "boot-a", 0, 1.0)
    assert not escalation.on_failure(app, APP, "boot-b", 3, 2.0)  # restart_app: the job's problem, no escalation
    unknown = GpuRecord()
    escalation.on_failure(unknown, XID79, None, 0, 1.0)
    assert not escalation.on_failure(unknown, XID79, None, 0, 2.0)  # no boot id readable: never guessed


def _gpu() -> GpuSample:
    return GpuSample(uuid=U0, index=0, name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:07:00.0")


async def _tick(r: Remediation, store: Store, h: GpuHealth) -> None:
    store.ingest(HealthChange({U0: h}))
    await r.tick()


def _metrics(r: Remediation) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(r.collector())
    return generate_latest(reg).decode()


async def test_escalation_across_a_reboot_then_acknowledged_over_the_api(tmp_path: Path) -> None:
    clock, store = ManualClock(), Store()
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(_gpu(),)))
    before = Remediation(RemediationConfig(), store, clock, tmp_path, host="h1", boot_id="boot-a")
    await _tick(before, store, XID79)
    assert not before.alerts()

    # The node was rebooted, as asked; the same GPU fails the same way.
    clock.advance(600.0)
    after = Remediation(RemediationConfig(), Store(), clock, tmp_path, host="h1", boot_id="boot-b")
    after.store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(_gpu(),)))
    await _tick(after, after.store, HEALTHY)
    await _tick(after, after.store, XID79)
    (alert,) = after.alerts()
    assert alert.name == "GpuHealthEscalated" and alert.severity == "critical"
    assert alert.labels["uuid"] == U0 and alert.labels["gpu"] == "0" and alert.labels["model"].startswith("NVIDIA")
    assert alert.summary == "GPU 0 failed again after a reboot: the reboot did not help"
    assert alert.description.startswith("Next: drain the node and inspect the GPU")
    assert f'gpuwatchd_gpu_health_escalation{{uuid="{U0}"}} 1.0' in _metrics(after)

    app = web.Application()
    app.add_routes(health_routes(after, lambda: ApiConfig(write_token=SecretStr(TOKEN))))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.post("/api/v1/health/ack", json={"gpu": "0"})
        assert resp.status == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for body, error in (({"gpu": "7"}, "no GPU '7'"), ({"gpu": "0", "kind": "fixed"}, "kind: expected one of"),
                            ({"gpu": 0}, "gpu: expected a string"), ({}, "gpu: required"), ([1], "expected a JSON"),
                            ({"gpu": "0", "x": 1}, "unknown key 'x'"), ({"gpu": "0", "comment": "c" * 501}, "500")):
            resp = await client.post("/api/v1/health/ack", json=body, headers=auth)
            assert resp.status == 400 and error in (await resp.json())["error"], (body, await resp.text())
        resp = await client.post("/api/v1/health/ack", headers=auth,
                                 json={"gpu": "0", "comment": "reseated\x1b[2J, new cable", "by": "erin"})
        assert resp.status == 200
        data = await resp.json()
        assert data["uuid"] == U0 and data["kind"] == "inspected" and data["cleared"] == {"escalation": 1,
                                                                                             "failures": 2}
        assert data["comment"] == "reseated [2J, new cable"  # no escape sequences reach a terminal
        acks = await (await client.get("/api/v1/health/acks")).json()
        assert [(a["uuid"], a["kind"], a["by"]) for a in acks] == [(U0, "inspected", "erin")]
    finally:
        await client.close()
    assert not after.alerts()
    assert f'gpuwatchd_gpu_health_escalation{{uuid="{U0}"}}' not in _metrics(after)
    assert 'gpuwatchd_health_acks_total{kind="inspected"} 1.0' in _metrics(after)
    saved = json.loads((tmp_path / "remediation.json").read_text())
    assert U0 not in saved["gpus"] and saved["acks"][0]["comment"] == "reseated [2J, new cable"
    # After the ack the history starts over: one more failure after another reboot is level 1 at most, not 2.
    again = Remediation(RemediationConfig(), after.store, clock, tmp_path, host="h1", boot_id="boot-b")
    await _tick(again, again.store, XID79)
    assert not again.alerts()


async def test_a_gpu_reset_is_seen_as_the_gpu_leaving_and_coming_back(tmp_path: Path) -> None:
    clock, store = ManualClock(), Store()
    r = Remediation(RemediationConfig(), store, clock, tmp_path, host="h1", boot_id="boot-a")
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(_gpu(),)))
    await _tick(r, store, DBE)
    clock.advance(5.0)
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, lost=(LostGpu(index=0, uuid=U0),)))
    await _tick(r, store, DBE)
    clock.advance(5.0)
    store.apply(Snapshot(timestamp=clock.now(), nvml_ok=True, gpus=(_gpu(),)))  # reset: back
    await _tick(r, store, HEALTHY)
    assert not r.alerts()
    await _tick(r, store, DBE)
    (alert,) = r.alerts()
    assert alert.summary == "GPU 0 failed again after a GPU reset: the GPU reset did not help"
